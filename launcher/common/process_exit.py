"""A process's end without the interpreter's finalization, for the processes whose finalization does harm or only
costs: a rank (launcher/train/teardown.py: gloo's worker threads abort a finalizing interpreter) and DeepSpeed's
per-node launcher (launcher/launch/deepspeed_processes.py: half a second of tearing down torch after every job)."""
from __future__ import annotations

import atexit
import os
import sys
from typing import Callable, NoReturn

from launcher.common.io import flush_console


def exit_without_finalizing(main: Callable[[], int | None]) -> NoReturn:
    """Run `main` and end the process with its exit code as `sys.exit(main())` would (an unexpected error: its
    traceback and 1; `sys.exit("text")`: the text and 1), but with os._exit after the atexit handlers (logging,
    weakref finalizers) and a flush of the console."""
    try:
        code = main()
    except SystemExit as stop:
        code = stop.code
    except BaseException:  # noqa: BLE001  printed as the interpreter would, then exit code 1
        sys.excepthook(*sys.exc_info())
        code = 1
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()  # what the interpreter would run first at its exit; finalization itself is skipped
    flush_console()
    os._exit(code or 0)

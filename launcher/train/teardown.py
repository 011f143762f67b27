"""The end of a rank's process, whatever ended it: its output flushed, then its process group destroyed,
before the interpreter finalizes.

Why: gloo runs each collective on a C++ worker thread that drops its finished work later, taking the GIL
when the work holds Python-owned tensors (all_gather_object). If the interpreter is finalizing by then,
Python ends that thread inside a noexcept destructor and libstdc++ aborts the process (SIGABRT, exit 134
instead of the rank's own code). Destroying the process group joins those workers while Python still
runs. The crash as it was seen: docs/training.md, "Exit codes of every command".
"""
from __future__ import annotations

import os
import sys

from launcher.io import flush_console, write_line


def end_rank() -> None:
    """Flush stdout/stderr (a console that went away is redirected first: launcher/io.py, so the
    interpreter's final flush cannot turn the exit code into 120), then destroy the process group if this
    rank started one (idempotent; never raises: the rank's own exit code and error line are what the job
    reports)."""
    flush_console()
    distributed = sys.modules.get("torch.distributed")  # a rank that failed before importing torch has none
    if distributed is None or not distributed.is_available() or not distributed.is_initialized():
        return
    try:
        distributed.destroy_process_group()
    except Exception as err:  # noqa: BLE001  a broken group (a peer gone) must not turn the exit into a traceback
        write_line(f"pretrain (rank {os.environ.get('RANK', '?')}): note: process group teardown: {err}")

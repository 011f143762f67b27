"""The end of a rank's process, whatever ended it (finished, stopped on a signal, its own error, a bug):
its output flushed, then its process group destroyed, before the interpreter finalizes.

Why the process group: torch's gloo backend runs each collective on a C++ worker thread, which drops
its reference to the finished work when it gets to it, possibly after the main thread has moved on.
A work of `all_gather_object` (the last collectives of a failed save: Checkpointer._agree) holds
tensors owned by Python objects, so dropping it takes the GIL. If the interpreter is finalizing by
then, Python ends that thread (pthread_exit) inside the work's noexcept destructor and libstdc++
aborts the process: "terminate called without an active exception", SIGABRT, exit 134 instead of the
rank's own exit code (seen on a loaded machine in about one exit in ten, with a core dump:
ProcessGroupGloo::runLoop -> ~AsyncAllgatherWork -> decref -> take_gil -> pthread_exit). Destroying
the process group shuts its backend down, which joins those workers while the interpreter still runs.
DeepSpeed adds no thread of its own on this path: deepspeed.comm only forwards to torch.distributed.
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

"""Holding a stop back: a SIGTERM / SIGINT that arrives inside `stops_held()` waits in the signal mask and
is delivered, to whatever handler is installed, when the block ends. Where a block must not be cut:

- torch's import (the CLI): its C++ calls Python there (pybind11), and the exception a stop raises inside
  such a call aborts the process ("terminate called after throwing ... error_already_set", SIGABRT)
  instead of ending the command with 128 + the signal;
- a rank's rendezvous: a signal interrupts the sleep between torch's TCPStore connection attempts, which
  prints a C++ warning with a stack trace (then retries); held, it changes nothing either way.
"""
from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Iterator

from launcher.common.defaults import RANK_STOP_SIGNALS


@contextmanager
def stops_held() -> Iterator[None]:
    """SIGTERM and SIGINT held by the signal mask in this block, delivered when it ends."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, RANK_STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)  # a held stop is delivered here, to the handler

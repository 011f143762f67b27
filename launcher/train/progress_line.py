"""Rank 0's progress on the console: a plain line every N steps, or a status line redrawn in place.

A rank never writes to a terminal (its output goes through DeepSpeed's launcher into a pipe), so
`roformer pretrain` tells it how in PROGRESS_ENV: "lines" (the default; files and pipes): a plain line
every `every` steps and at the last; "status" (a terminal): at most one STATUS_MARKER line per
STATUS_INTERVAL_S, which launcher/launch/console.py redraws as the bottom line and does not log.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Callable

from launcher.common.defaults import PROGRESS_ENV, STATUS_MARKER
from launcher.common.io import write_line

LINES, STATUS = "lines", "status"
STATUS_INTERVAL_S = 1.0
AUTO_LINES = 20  # progress_every 0: about this many lines over the whole schedule


def progress_every(configured: int, total_steps: int) -> int:
    """Steps between plain progress lines (logging.progress_every; 0 = about AUTO_LINES per run)."""
    return configured if configured > 0 else max(1, round(total_steps / AUTO_LINES))


class ProgressPrinter:
    def __init__(self, total_steps: int, every: int, mode: str | None = None, out=None):
        self.total_steps, self.every = total_steps, every
        self.mode = mode or os.environ.get(PROGRESS_ENV, LINES)
        self.out = out or sys.stderr
        self._last_status = float("-inf")

    def step(self, step: int, text: Callable[[], str]) -> None:
        """After step `step` (steps completed); `text` is only called when a line is due."""
        last = step == self.total_steps
        if self.mode == STATUS:
            now = time.monotonic()
            if last or now - self._last_status >= STATUS_INTERVAL_S:
                self._last_status = now
                self._print(STATUS_MARKER + text())
        elif last or step % self.every == 0:
            self._print(text())

    def message(self, text: str) -> None:
        self._print(text)

    def _print(self, text: str) -> None:
        write_line(text, self.out)  # whole: the ranks share one pipe

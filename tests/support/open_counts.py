"""Counting the files a block of code opens (the sys.addaudithook 'open' events): the tests that a start-up
reads each input once (tests/unit/test_init_from.py, test_branch_from.py, test_tracking.py)."""
from __future__ import annotations

import collections
import contextlib
import os
import sys
from pathlib import Path
from typing import Iterator

OPENED: collections.Counter = collections.Counter()
"""Real path -> opens, while a test counts (`counting_opens`; the audit hook below stays installed for the process)."""
_COUNTING: list[bool] = []


def _count_opens(event: str, args: tuple) -> None:
    if event == "open" and _COUNTING and isinstance(args[0], (str, bytes, os.PathLike)):
        OPENED[os.path.realpath(os.fsdecode(args[0]))] += 1


sys.addaudithook(_count_opens)  # once per process: this module is imported once


@contextlib.contextmanager
def counting_opens(*roots: Path) -> Iterator[dict[str, int]]:
    """The opens of files under `roots` in the block: real path -> count, filled in when the block ends."""
    opened: dict[str, int] = {}
    OPENED.clear()
    _COUNTING.append(True)
    try:
        yield opened
    finally:
        _COUNTING.clear()
        prefixes = tuple(os.path.realpath(root) + os.sep for root in roots)
        opened.update((path, n) for path, n in OPENED.items() if path.startswith(prefixes))
        OPENED.clear()

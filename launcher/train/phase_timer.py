"""Seconds and resident memory of each start-up phase of a rank (the `startup` event of metrics.jsonl)."""
from __future__ import annotations

import os
import time


def resident_bytes() -> int | None:
    """This process's resident set size now (Linux /proc/self/statm; None where there is none)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class PhaseTimer:
    """Seconds spent in each start-up phase, and the resident memory at each phase's end (the `startup`
    event of metrics.jsonl): the memory after `run_files_and_conversion` is the process before the model
    exists (interpreter, torch, DeepSpeed, data readers, process group), which `roformer plan`'s
    estimate of the model-dependent memory does not include."""

    def __init__(self, process_start: float):
        self.process_start = process_start
        self.phases = {"imports": time.time() - process_start}
        self.resident = {"imports": resident_bytes()}
        self.mark = time.perf_counter()

    def phase(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = now - self.mark
        self.resident[name] = resident_bytes()
        self.mark = now

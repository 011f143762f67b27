"""A rank's heartbeat: what it is doing and for how long that may take, in RUN_DIR/heartbeats/.

Written by the rank (launcher.train.heartbeats) at the start of every step and phase, read by its
rank guard (launcher.launch.watchdog), which stops the job when the phase outlives its bound. One
small JSON file per rank, replaced atomically (a reader never sees half a record) but not fsynced:
a heartbeat is worthless after a crash, and it is written every step on a shared filesystem.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

Record = TypeVar("Record")


@dataclass
class Heartbeat:
    """One rank's progress, as of its latest phase start."""

    rank: int
    """Global rank."""
    pid: int
    """The rank's process id (its guard checks it is its own child, not a previous run's file)."""
    phase: str
    """What the rank started: 'start-up: engine', 'train', 'validation', 'checkpoint save', ... 'finished'."""
    step: int | None
    """Optimizer steps completed when the phase started (so 'train' with step k is the (k+1)-th step);
    None during start-up."""
    bound_seconds: float | None
    """How long the phase may take before the rank counts as hung; None = not watched (it ended)."""
    monotonic: float
    """time.monotonic() when written: the same clock as the guard's on the same node (no clock skew)."""
    wall_time: float
    """time.time() when written, for people reading the file."""
    seq: int
    """Counts the heartbeats of this process."""

    def describe_phase(self) -> str:
        """'train step 58', 'checkpoint save after step 50', 'start-up: engine'."""
        if self.step is None:
            return self.phase
        return f"train step {self.step + 1}" if self.phase == "train" else f"{self.phase} after step {self.step}"


def write_record(path: Path, record: Any) -> None:
    """Replace `path` (its folder exists) with the dataclass `record` as JSON: atomic rename, no fsync."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(dataclasses.asdict(record)), encoding="utf-8")
    os.replace(tmp, path)


def read_record(path: Path, cls: type[Record]) -> Record | None:
    """The record in `path`, or None when it is missing or not a `cls` record (another version)."""
    try:
        values = json.loads(Path(path).read_text(encoding="utf-8"))
        return cls(**values)
    except (OSError, ValueError, TypeError):
        return None

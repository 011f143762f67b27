"""`logging.report_to` -> rank 0's sinks, and what a tracker gets for the run as a whole."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from launcher.common.defaults import TRACKERS
from launcher.tracking.remote import RemoteSink
from launcher.tracking.sink import Sink
from launcher.tracking.tensorboard import TensorBoardSink
from launcher.tracking.translate import run_params


def open_sinks(report_to: tuple[str, ...], run_dir, start_step: int, log_every: int, total_steps: int,
               stage_ends: list[int], params: dict | None = None, tags: dict | None = None,
               tokens_before: Callable[[int], int] | None = None) -> list[Sink]:
    """The sinks of `report_to` for rank 0 (TensorBoard first; with `tokens_before`, a schedule in tokens, it also
    draws the main curves against token slots)."""
    sinks: list[Sink] = []
    if "tensorboard" in report_to:
        sinks.append(TensorBoardSink(Path(run_dir.tensorboard), start_step, log_every, total_steps, tokens_before))
    for name in TRACKERS:
        if name in report_to:
            sinks.append(RemoteSink(name, run_dir, params or {}, tags or {}, stage_ends))
    return sinks


@dataclass(frozen=True)
class TrackedRun:
    """What the trackers get for a run as a whole (launcher/train/metrics.py Metrics opens the sinks with it)."""

    report_to: tuple[str, ...] = ("tensorboard",)
    """logging.report_to: the sinks."""
    params: dict | None = None
    """The resolved config as flat parameters."""
    tags: dict | None = None
    """The run and data directories."""


def tracked_run(config_dict: dict, run_dir, data_dir: str, report_to) -> TrackedRun:
    """A run's sinks, its resolved config as flat parameters, the run and data directories as tags."""
    return TrackedRun(tuple(report_to), run_params(config_dict),
                      {"run_dir": str(Path(run_dir.root)), "data_dir": str(data_dir)})

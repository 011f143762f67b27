"""The one interface every destination of rank 0's records implements, and `report_to` -> sinks."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from launcher.errors import UserError

KNOWN_SINKS = ("tensorboard", "mlflow", "wandb")
TRACKERS = ("mlflow", "wandb")


class Sink:
    """Gets each record exactly as launcher/train/metrics.py wrote it to metrics.jsonl (kind train / valid /
    event), in order. A sink never raises into training: remote ones queue (launcher/tracking/remote.py)."""

    name = "sink"

    def start(self, history: list[dict], start_step: int) -> None:
        """The run (re)starts after `start_step` steps; `history` is metrics.jsonl as kept for it (catch-up)."""

    def record(self, record: dict) -> None:
        """One record, just written to metrics.jsonl."""

    def rewind(self, step: int) -> None:
        """Train/valid records past `step` were dropped from metrics.jsonl (a guard rewind)."""

    def guard_scalars(self, step: int, action: str, rewinds: int) -> None:
        """A numerics-guard trigger (its event record arrives through record() as well)."""

    def close(self, outcome: str | None = None) -> None:
        """End of this process's part of the run (outcome: finished / stopped / guard_stopped / None)."""


def parse_report_to(value, where: str = "logging.report_to") -> tuple[str, ...]:
    """A list or comma-separated string of KNOWN_SINKS, or 'none' (nothing, TensorBoard included)."""
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise UserError(f"{where}: expected a list of {', '.join(KNOWN_SINKS)} or 'none', got {value!r}")
    names = [v.lower() for v in value]
    if "none" in names:
        if len(names) > 1:
            raise UserError(f"{where}: 'none' turns every sink off; it cannot be combined with {names}")
        return ()
    unknown = [n for n in names if n not in KNOWN_SINKS]
    if unknown:
        raise UserError(f"{where}: unknown {', '.join(unknown)} (known: {', '.join(KNOWN_SINKS)}, none)")
    return tuple(dict.fromkeys(names))


def open_sinks(report_to: tuple[str, ...], run_dir, start_step: int, log_every: int, total_steps: int,
               stage_ends: list[int], params: dict | None = None, tags: dict | None = None) -> list[Sink]:
    """The sinks of `report_to` for rank 0 (TensorBoard first)."""
    sinks: list[Sink] = []
    if "tensorboard" in report_to:
        from launcher.tracking.tensorboard import TensorBoardSink

        sinks.append(TensorBoardSink(Path(run_dir.tensorboard), start_step, log_every, total_steps))
    for name in TRACKERS:
        if name in report_to:
            from launcher.tracking.remote import RemoteSink

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
    from launcher.tracking.translate import run_params

    return TrackedRun(tuple(report_to), run_params(config_dict),
                      {"run_dir": str(Path(run_dir.root)), "data_dir": str(data_dir)})

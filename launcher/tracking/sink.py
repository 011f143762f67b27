"""The one interface every destination of rank 0's records implements (the sinks are opened by
launcher/tracking/open_sinks.py; `logging.report_to` is parsed by launcher/config/report_to.py)."""
from __future__ import annotations


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

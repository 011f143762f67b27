"""The step convention of RUN_DIR/metrics.jsonl, and reading files written before it.

One convention everywhere: **a step number counts optimizer steps completed**. The train record of
the run's first step has `step` 1; a validation, a checkpoint event and its tag `global_stepN`, the
sidecar's `step`, TensorBoard's x axis and the console all say N after N steps. A stage's
`first_step` (stages.json, the `stage_start` event) is the number of steps completed when it
starts, so its own steps are first_step + 1 ... first_step + steps.

metrics.jsonl files written before this convention (no `metrics_format` event) numbered train and
validation records by the 0-based index of the step just taken, i.e. one less; their events were
already counts. `normalise` shifts such records by one, so every reader sees one convention, and
the trainer rewrites an old file into the new one when it resumes the run (launcher/train/metrics.py).
"""
from __future__ import annotations

import time

METRICS_FORMAT = 2
FORMAT_EVENT = "metrics_format"
STEP_CONVENTION = "steps completed"
_SHIFTED_KINDS = ("train", "valid")  # numbered by step index before format 2


def format_event() -> dict:
    """The first record of a format-2 file."""
    return {"kind": "event", "event": FORMAT_EVENT, "version": METRICS_FORMAT, "steps": STEP_CONVENTION,
            "time": time.time()}


def is_current(records: list[dict]) -> bool:
    """Whether the records (all of one file, any kinds) carry the format-2 marker."""
    return any(r.get("event") == FORMAT_EVENT and r.get("version", 0) >= METRICS_FORMAT for r in records)


def step_offset(records: list[dict]) -> int:
    """What to add to a train/valid record's `step` to get steps completed (0 for format 2, 1 before)."""
    return 0 if is_current(records) else 1


def normalise(records: list[dict]) -> list[dict]:
    """The records of one file with train/valid steps counted as steps completed (copies where shifted)."""
    offset = step_offset(records)
    if not offset:
        return records
    return [{**r, "step": r["step"] + offset} if r.get("kind") in _SHIFTED_KINDS and isinstance(r.get("step"), int)
            else r for r in records]

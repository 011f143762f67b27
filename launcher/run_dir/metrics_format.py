"""The step convention of RUN_DIR/metrics.jsonl, and reading files written before it.

A step number counts optimizer steps completed: the first train record has step 1; a validation, a
checkpoint `global_stepN`, the sidecar and TensorBoard say N after N steps; a stage's `first_step` is the
steps completed when it starts. Files without a `metrics_format` event numbered train and validation
records one less: `normalise` shifts them, and the trainer rewrites such a file when it resumes the run.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

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


def parsed_lines(path: Path) -> Iterator[dict | None]:
    """Each non-blank line of a metrics.jsonl in the order written, as read (steps not normalised):
    None for a line that is no JSON object (cut by a kill, or damaged; bytes that are not UTF-8 are
    replaced). Nothing for no file. One line at a time, so a long run's file is never held whole."""
    if not path.is_file():
        return
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                record = None
            yield record if isinstance(record, dict) else None


def read_records(path: Path) -> list[dict]:
    """Every record of a metrics.jsonl, all kinds, in the order written, steps counted as steps completed
    ([] for no file; a line that is no JSON object skipped)."""
    return normalise([record for record in parsed_lines(path) if record is not None])

"""The numerics guard's state rebuilt from the run's own records, so that after a resume, a restart, a
rewind or a branch it is the state the uninterrupted run had at that step (no file of its own in checkpoints).

RUN_DIR/metrics.jsonl holds one train record per step and every event, in the order they happened. The
steps that count are those of the run as it stands: a later record of a step replaces it and every step
after it, and a `resume` event (step N) or a guard `rewind` event (to_step N) abandons the steps past N.
A branch (RUN_DIR/branch_from.json) continues its source's steps up to the branch step. The guard replays
those figures (NumericsGuard.replay); the rewinds it counts are those made before the checkpoint the run
resumed from was saved (the guard `rewind` events before that checkpoint's latest `checkpoint` event).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from launcher.run_dir.layout import RunDir
from launcher.run_dir.records import read_branch_record
from launcher.train.metrics import read_all_records
from launcher.train.numerics_guard import StepFigures

GUARD_EVENT = "guard"
"""metrics.jsonl event of every trigger and action: fields action (warn / stop / rewind), rule, step,
began, figure, value, median, threshold, message; a rewind adds to_step, tag, skipped_batches, seconds."""

_MAX_BRANCH_DEPTH = 32  # a branch of a branch of ...; more is a loop of records, not a lineage


@dataclass(frozen=True)
class Rewound:
    """One rewind, remembered to recognise the same trigger coming back within its reach."""

    rule: str
    trigger_step: int
    to_step: int
    skipped_batches: int

    @property
    def reach(self) -> int:
        """The last step at which the same rule firing again means the skip did not help."""
        return self.trigger_step + self.skipped_batches


@dataclass(frozen=True)
class GuardHistory:
    steps: list[StepFigures]
    """Steps 1..N of the run as it stands (fewer where records are missing), in order."""
    rewinds: list[Rewound]


def read_history(run_dir: RunDir, step: int) -> GuardHistory:
    """What the guard of a run at `step` (steps completed) is rebuilt from."""
    records = read_all_records(run_dir)
    return GuardHistory(_figures(_train_records(run_dir, records, step, 0)), _rewinds_before(records, step))


def _train_records(run_dir: RunDir, records: list[dict], up_to: int, depth: int) -> list[dict]:
    """The train records of steps 1..up_to of the run as it stands, its branch source's first."""
    branch = read_branch_record(run_dir)
    before: list[dict] = []
    start = 0
    if branch is not None and isinstance(branch.get("step"), int) and depth < _MAX_BRANCH_DEPTH:
        start = min(branch["step"], up_to)
        source = RunDir(Path(branch["source_run_dir"]))
        before = _train_records(source, read_all_records(source), start, depth + 1)
    return before + [r for r in _timeline(records) if start < r["step"] <= up_to]


def _timeline(records: list[dict]) -> list[dict]:
    """The train records that stand, in step order (each later start or rewind abandons the steps past it)."""
    kept: list[dict] = []

    def abandon_after(step) -> None:
        while kept and isinstance(step, int) and kept[-1]["step"] > step:
            kept.pop()

    for r in records:
        if r.get("kind") == "train" and isinstance(r.get("step"), int) and isinstance(r.get("loss"), (int, float)):
            abandon_after(r["step"] - 1)
            kept.append(r)
        elif r.get("event") == "resume":
            abandon_after(r.get("step"))
        elif r.get("event") == GUARD_EVENT and r.get("action") == "rewind":
            abandon_after(r.get("to_step"))
    return kept


def _figures(train: list[dict]) -> list[StepFigures]:
    figures, skipped = [], 0
    for record in train:
        figures.append(StepFigures.of_record(record, skipped))
        skipped = record.get("skipped_steps") or 0
    return figures


def _rewinds_before(records: list[dict], step: int) -> list[Rewound]:
    """The rewinds made before the run saved its checkpoint of `step` (none when this run has no record of
    that save, e.g. a branch's first start)."""
    saved = [i for i, r in enumerate(records) if r.get("event") == "checkpoint" and r.get("step") == step]
    if not saved:
        return []
    return [Rewound(r["rule"], r["step"], r["to_step"], r["skipped_batches"]) for r in records[:saved[-1]]
            if r.get("event") == GUARD_EVENT and r.get("action") == "rewind"]

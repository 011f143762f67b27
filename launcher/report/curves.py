"""A run's metrics as typed columns: RUN_DIR/metrics.jsonl (format: launcher/train/metrics.py) and
RUN_DIR/stages.json read into what the plots and the report draw.

Tolerant by design, because it reads runs that are still being written or were killed: a line cut
by a kill (or otherwise not JSON) is skipped, a field a record lacks becomes NaN, and optional
fields (`mfu`, `tflops`) exist only when some record carries them.
"""
from __future__ import annotations

import json
import math
import sys
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from launcher.common.errors import UserError
from launcher.run_dir.metrics_format import parsed_lines, step_offset
from launcher.run_dir.layout import RunDir
from launcher.run_dir.records import RecordVersion, files_in_effect, read_versions



@dataclass(frozen=True)
class StageSpan:
    """One stage of the schedule, from stages.json (or, before it exists, from the records)."""

    index: int
    """0-based position in the schedule."""
    name: str
    max_seq_len: int
    global_batch_size: int
    first_step: int
    """Global step the stage starts at (0-based)."""
    steps: int
    micro_batch_size: int | None = None
    grad_accum_steps: int | None = None
    mixture: tuple[tuple[str, float], ...] | None = None
    """(source, share) pairs of the stage's mixture; None = the sources in proportion to their size."""
    ramp: tuple[tuple[int, int, int, int], ...] = ()
    """A batch ramp's pieces in order, each (global batch, micro-batch, grad-accum, steps); () without a ramp (then
    global_batch_size is the stage's one batch; with one, the ramp's last batch)."""

    @property
    def end_step(self) -> int:
        return self.first_step + self.steps

    @property
    def batch_text(self) -> str:
        """'32', or a ramp's '8-32'."""
        batches = [piece[0] for piece in self.ramp] or [self.global_batch_size]
        return f"{min(batches)}-{max(batches)}" if min(batches) != max(batches) else str(batches[0])

    @property
    def planned_tokens(self) -> int:
        """Token slots (batch x max_seq_len per step) the stage trains in all."""
        return self.max_seq_len * (sum(b * n for b, _, _, n in self.ramp) if self.ramp
                                   else self.global_batch_size * self.steps)

    @property
    def label(self) -> str:
        """What a boundary marker says: name and shape (length x global batch, a ramp's as a range)."""
        return f"{self.name}: {self.max_seq_len} x {self.batch_text}"


@dataclass(frozen=True)
class TrainCurve:
    """One entry per training step in metrics.jsonl, in step order (NaN where a record lacks a field)."""

    step: np.ndarray
    """Optimizer steps completed after this one (1 for the run's first step): the x of the plots."""
    stage: np.ndarray
    """0-based stage index of the step."""
    loss: np.ndarray
    accuracy: np.ndarray
    """MLM accuracy over the step's masked tokens."""
    lr: np.ndarray
    loss_scale: np.ndarray
    grad_norm: np.ndarray
    tokens_per_s: np.ndarray
    step_time_s: np.ndarray
    tokens: np.ndarray
    """Non-padding tokens trained on (all ranks) up to and including the step, summed from the
    records (tokens_per_s x step_time_s), so it starts at 0 with the file's first record."""
    skipped_steps: np.ndarray
    """fp16 steps skipped on overflow so far."""
    mfu: np.ndarray | None
    """Model FLOP utilisation as a fraction of the hardware's peak (record key `mfu`), when the records
    carry it."""
    tflops: np.ndarray | None
    """Achieved model TFLOP/s per rank (record key `tflops`, launcher/common/mfu.py), when the records carry it."""
    global_batch_size: np.ndarray | None = None
    """The step's global batch (sequences), NaN where a record lacks it."""
    grad_noise_scale: np.ndarray | None = None
    """The measured critical batch B_simple (sequences; launcher/train/noise_scale.py), NaN on the steps that
    did not measure it; None when no record carries it."""

    def __len__(self) -> int:
        return len(self.step)

    @property
    def steps_done(self) -> int:
        """Optimizer steps completed at the last record (0 before the first)."""
        return int(self.step[-1]) if len(self) else 0

    def tokens_at(self, steps: np.ndarray) -> np.ndarray:
        """Tokens trained at each of `steps` (the last train record at or before it; 0 before any)."""
        index = np.searchsorted(self.step, steps, side="right") - 1
        return np.where(index >= 0, self.tokens[np.clip(index, 0, None)] if len(self) else 0, 0)


@dataclass(frozen=True)
class ValidCurve:
    """The validation records, in step order."""

    step: np.ndarray
    """Optimizer steps completed when the validation ran."""
    stage: np.ndarray
    loss: np.ndarray
    accuracy: np.ndarray
    tokens: np.ndarray
    """Tokens trained when the validation ran (from the train curve)."""

    def __len__(self) -> int:
        return len(self.step)


@dataclass(frozen=True)
class Boundary:
    """Where a stage begins on both x axes of the plots: steps and tokens completed before its first step."""

    stage: StageSpan
    step: float
    tokens: float


@dataclass(frozen=True)
class Curves:
    train: TrainCurve
    valid: ValidCurve
    stages: list[StageSpan]
    events: list[dict]
    """`kind: event` records in file order (startup, stage_start, checkpoint, resume, finished, ...)."""
    skipped_lines: int
    """Lines of metrics.jsonl that were not a JSON object (cut by a kill, or damaged)."""
    tokens_by_source: dict[int, dict[str, float]] = field(default_factory=dict)
    """Stage index -> {source: tokens drawn} summed over the train records' `tokens_by_source`."""
    unit: str = "steps"
    """The schedule's unit: 'tokens' when a stage is counted in tokens or ramps its batch over tokens (stages.json's
    `schedule_unit`, else the schedule file the recorded config names); then `train.tokens` is the schedule's token
    slots (the records' `schedule_tokens`) and the plots against steps are drawn against tokens."""

    @property
    def x_axis(self) -> str:
        """'tokens' for a schedule in tokens, else 'step': the x of the plots that are not per axis."""
        return "tokens" if self.unit == "tokens" else "step"

    def has_ramp(self) -> bool:
        """Whether some stage changes its global batch (a batch ramp)."""
        return any(stage.ramp for stage in self.stages)

    def planned_tokens(self) -> int:
        """Token slots of the whole schedule (0 when the stages are not recorded)."""
        return sum(stage.planned_tokens for stage in self.stages if stage.steps)

    def boundaries(self) -> list[Boundary]:
        """The start of every stage the records reach, the first one included."""
        result = []
        for stage in self.stages:
            rows = np.flatnonzero(self.train.stage == stage.index)
            if not len(rows):
                continue
            first = rows[0]
            before_tokens = self.train.tokens[first - 1] if first > 0 else 0.0
            result.append(Boundary(stage, float(self.train.step[first]) - 1, float(before_tokens)))
        return result

    def critical_batch(self, stage_index: int) -> tuple[float, int] | None:
        """The median of a stage's measured critical batch (grad_noise_scale, sequences) and how many estimates
        it is of; None when the stage has none."""
        column = self.train.grad_noise_scale
        if column is None:
            return None
        values = column[(self.train.stage == stage_index) & np.isfinite(column)]
        return (float(np.median(values)), len(values)) if len(values) else None

    def optional(self, name: str) -> bool:
        """Whether the optional column `name` (mfu, tflops) has any finite value."""
        column = getattr(self.train, name)
        return column is not None and bool(np.isfinite(column).any())


TRAIN_FIELDS = ("step", "stage", "loss", "mlm_accuracy", "lr", "loss_scale", "grad_norm", "tokens_per_s",
                "step_time_s", "skipped_steps", "mfu", "tflops", "global_batch_size", "schedule_tokens",
                "grad_noise_scale")
"""The fields of a train record the plots use (launcher/train/metrics.py writes them)."""
OPTIONAL_FIELDS = ("mfu", "tflops", "grad_noise_scale")


@dataclass
class Records:
    """metrics.jsonl as read: train records as columns (8 bytes a field: a run of 10^6 steps fits in
    100 MB), validation and event records as they are."""

    train: dict[str, array]
    """TRAIN_FIELDS -> values in file order (NaN where a record lacks the field)."""
    present: set[str]
    """The OPTIONAL_FIELDS some train record carries."""
    stage_firsts: dict[int, dict]
    """The first train record of each stage (describes the stages when stages.json is missing)."""
    valid: list[dict]
    events: list[dict]
    skipped: int
    """Lines that were not a JSON object (cut by a kill, or damaged)."""
    tokens_by_source: dict[int, dict[str, float]] = field(default_factory=dict)
    """Stage index -> {source: tokens drawn}: the sum of the train records' `tokens_by_source` (a
    resumed run's file holds each step once: launcher/train/metrics.py cuts the lost future)."""

    def step_offset(self) -> int:
        """Added to a train/valid record's `step` to count steps completed: 0, or 1 for a file written
        before that convention (launcher/run_dir/metrics_format.py)."""
        return step_offset(self.events)


def collect_records(path: Path) -> Records:
    """The file's records sorted into columns (metrics_format.parsed_lines reads it, a line at a time)."""
    records = Records({f: array("d") for f in TRAIN_FIELDS}, set(), {}, [], [], 0)
    for record in parsed_lines(path):
        if record is None:  # the last line of a killed run, or damage
            records.skipped += 1
        elif record.get("kind") == "train" and isinstance(record.get("step"), int):
            for name, column in records.train.items():
                column.append(_number(record.get(name)))
            records.present.update(f for f in OPTIONAL_FIELDS if f in record)
            if isinstance(record.get("stage"), int):
                records.stage_firsts.setdefault(record["stage"], record)
                drawn = record.get("tokens_by_source")
                if isinstance(drawn, dict):
                    sums = records.tokens_by_source.setdefault(record["stage"], {})
                    for source, tokens in drawn.items():
                        sums[source] = sums.get(source, 0.0) + _number(tokens)
        elif record.get("kind") == "valid" and isinstance(record.get("step"), int):
            records.valid.append(record)
        elif record.get("kind") == "event":
            records.events.append(record)
    return records


def load_curves(run_dir: Path) -> Curves:
    layout = RunDir(Path(run_dir))
    records = collect_records(layout.metrics)
    in_effect = records_in_effect(layout)
    unit = schedule_unit(in_effect["stages"], in_effect["config"])
    train = _train_curve(records, slots=unit == "tokens")
    valid_records = list({r["step"]: r for r in records.valid}.values())  # a repeated step: the later line
    valid_records.sort(key=lambda r: r["step"])
    valid_steps = _column(valid_records, "step") + records.step_offset()
    valid = ValidCurve(step=valid_steps, stage=_column(valid_records, "stage"), loss=_column(valid_records, "loss"),
                       accuracy=_column(valid_records, "mlm_accuracy"),
                       tokens=train.tokens_at(valid_steps).astype(float))
    return Curves(train=train, valid=valid, stages=read_stages(in_effect["stages"], records.stage_firsts, records.events),
                  events=records.events, skipped_lines=records.skipped, tokens_by_source=records.tokens_by_source,
                  unit=unit)


def schedule_unit(stages_file: Path, config_file: Path) -> str:
    """'tokens' or 'steps': stages.json's `schedule_unit` (written since token schedules exist: absent = steps), else
    for a run recorded before that, whether the schedule file its config.yaml names (when still readable) counts a
    stage in tokens (`tokens:`) or ramps a batch over tokens (`over:`)."""
    import yaml

    try:
        recorded = json.loads(stages_file.read_text(encoding="utf-8"))
        if isinstance(recorded.get("schedule_unit"), str):
            return recorded["schedule_unit"]
    except (OSError, ValueError, AttributeError):
        pass
    try:
        config = yaml.safe_load(config_file.read_text(encoding="utf-8"))
        schedule = yaml.safe_load(Path(config["schedule"]["file"]).read_text(encoding="utf-8"))
        stages = schedule["stages"] if isinstance(schedule, dict) else schedule
        return "tokens" if any("tokens" in stage or (isinstance(stage.get("global_batch_size"), dict)
                                                    and "over" in stage["global_batch_size"])
                               for stage in stages) else "steps"
    except (OSError, ValueError, KeyError, TypeError, AttributeError, yaml.YAMLError):
        return "steps"


def record_versions(layout: RunDir) -> list[RecordVersion]:
    """config_versions.json's entries ([] when missing or unreadable: the base files are in effect)."""
    try:
        return read_versions(layout)
    except (UserError, OSError):
        return []


def records_in_effect(layout: RunDir) -> dict[str, Path]:
    """kind (config, ds_config, stages) -> the newest version of that record file (launcher/run_dir/records.py)."""
    if not record_versions(layout):
        return {"config": layout.config, "ds_config": layout.ds_config, "stages": layout.stages}
    return files_in_effect(layout, sys.maxsize)


def read_stages(stages_file: Path, stage_firsts: dict[int, dict] | None = None,
                events: list[dict] = ()) -> list[StageSpan]:
    """The stages from a stages.json; without it (or unreadable), what the records say about them
    (`stage_firsts`: the first train record of each stage)."""
    try:
        raw = json.loads(stages_file.read_text(encoding="utf-8"))
        return [_stage_span(rows) for rows in _rows_by_stage(raw["stages"])]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    names = {e.get("stage"): e.get("name") for e in events if e.get("event") == "stage_start"}
    before = step_offset(list(events)) - 1  # a stage starts one step before its first record's step
    return [StageSpan(index=index, name=str(names.get(index) or f"stage {index + 1}"),
                      max_seq_len=int(record.get("max_seq_len") or 0),
                      global_batch_size=int(record.get("global_batch_size") or 0),
                      first_step=int(record["step"]) + before, steps=0)
            for index, record in sorted((stage_firsts or {}).items())]


def _rows_by_stage(rows: list[dict]) -> list[list[dict]]:
    """stages.json's rows grouped by stage: a batch ramp's pieces (rows of one `index`) together, in order."""
    groups: list[list[dict]] = []
    for row in rows:
        if groups and int(groups[-1][0]["index"]) == int(row["index"]):
            groups[-1].append(row)
        else:
            groups.append([row])
    return groups


def _stage_span(rows: list[dict]) -> StageSpan:
    """One stage from its stages.json rows (one, or a ramp's pieces: launcher/config/stages.py ResolvedStage)."""
    first, last = rows[0], rows[-1]
    ramp = tuple((int(r["global_batch_size"]), int(r["micro_batch_size"]), int(r["grad_accum_steps"]), int(r["steps"]))
                 for r in rows) if len(rows) > 1 else ()
    return StageSpan(index=int(first["index"]), name=str(first["name"]), max_seq_len=int(first["max_seq_len"]),
                     global_batch_size=int(last["global_batch_size"]),
                     first_step=int(first.get("stage_first_step", first["first_step"])),
                     steps=int(first.get("stage_steps", first["steps"])),
                     micro_batch_size=first.get("micro_batch_size"), grad_accum_steps=first.get("grad_accum_steps"),
                     mixture=tuple((str(k), float(v)) for k, v in first["mixture"].items()) if first.get("mixture")
                     else None, ramp=ramp)


def _column(records: list[dict], key: str) -> np.ndarray:
    return np.array([_number(r.get(key)) for r in records], dtype=float)


def _number(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value)


def _train_curve(records: Records, slots: bool = False) -> TrainCurve:
    """slots: `tokens` is the records' `schedule_tokens` (token slots trained up to and including the step, the unit of
    a schedule in tokens) where every record carries it; otherwise the non-padding tokens summed from the records."""
    columns = {name: np.frombuffer(column, dtype=float) if len(column) else np.zeros(0)
               for name, column in records.train.items()}
    # Step order; of two records of one step (a rewritten file) the later line wins.
    reversed_steps = columns["step"][::-1]
    _, last = np.unique(reversed_steps, return_index=True)
    keep = len(reversed_steps) - 1 - last  # ascending steps
    columns = {name: column[keep] for name, column in columns.items()}
    step_tokens = np.nan_to_num(columns["tokens_per_s"] * columns["step_time_s"], nan=0.0, posinf=0.0)
    tokens = np.cumsum(np.round(step_tokens))
    if slots and len(columns["schedule_tokens"]) and np.isfinite(columns["schedule_tokens"]).all():
        tokens = columns["schedule_tokens"]
    optional = {name: columns[name] if name in records.present else None for name in OPTIONAL_FIELDS}
    return TrainCurve(step=columns["step"] + records.step_offset(), stage=columns["stage"], loss=columns["loss"],
                      accuracy=columns["mlm_accuracy"], lr=columns["lr"], loss_scale=columns["loss_scale"],
                      grad_norm=columns["grad_norm"], tokens_per_s=columns["tokens_per_s"],
                      step_time_s=columns["step_time_s"], tokens=tokens,
                      skipped_steps=columns["skipped_steps"], global_batch_size=columns["global_batch_size"], **optional)

"""`roformer plan --from-run RUN`: a schedule file whose batch ramps follow the critical batch RUN measured.

RUN's metrics.jsonl carries, at the steps where the trainer estimated it, `grad_noise_scale` (B_simple =
tr(Sigma) / |G|^2, smoothed, in sequences; McCandlish et al. 2018) beside the step's `global_batch_size`;
RUN's stages.json gives each stage's length, batches, steps and the world size. Per stage the suggestion is
`global_batch_size: {start, end, over}`: start at the stage's first estimate, end at its last (each rounded
to the stage's granularity, micro-batch x world size, so every piece divides as the run's did), over the
token slots into the stage where the estimate first reached that end; a stage whose estimate did not grow
keeps one batch (its last estimate, rounded); a stage without estimates keeps the batch it ran. Stage ends
are the token slots the run trained in each stage. Nothing is started or changed: the text is printed or
written to a file the user passes to `roformer plan --config` / `pretrain` as schedule.file.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from launcher.common.errors import UserError
from launcher.run_dir.layout import RunDir
from launcher.run_dir.metrics_format import read_records

NOISE_KEY = "grad_noise_scale"
"""The train record's smoothed B_simple in sequences (absent at steps without an estimate)."""
CARRIED_KEYS = ("mask_prob", "attention", "positions")
"""Stage fields of stages.json copied into the suggestion as the run resolved them (so the stage trains alike)."""


@dataclass
class StageSuggestion:
    """One stage of the suggested schedule, with what it was derived from."""

    name: str
    max_seq_len: int
    tokens: int
    """Token slots (batch x length per step) the run trained in this stage: the stage's end."""
    granularity: int
    """Batches are multiples of this: the stage's smallest micro-batch x the world size."""
    ran: tuple[int, ...]
    """The global batches the run used in this stage, in order (one per piece)."""
    estimates: list[tuple[int, float]] = field(default_factory=list)
    """(token slots into the stage, B_simple) of each estimate in the stage, in step order."""
    extra: dict = field(default_factory=dict)
    """Stage fields carried over (CARRIED_KEYS the run's stage set, mixture, rope_theta when it differs)."""

    def batch(self) -> int | dict:
        """The suggested `global_batch_size`: a ramp {start, end, over, increment}, or one number."""
        if not self.estimates:
            return self.ran[-1]
        start, end = self._round(self.estimates[0][1]), self._round(self.estimates[-1][1])
        if end <= start:
            return end
        over = next(t for t, b in self.estimates if self._round(b) >= end)
        if over <= 0:  # the estimate was already at its end at the stage's start: no ramp to follow
            return end
        return {"start": start, "end": end, "over": over, "increment": self.granularity}

    def _round(self, value: float) -> int:
        return max(self.granularity, self.granularity * round(value / self.granularity))

    def entry(self) -> dict:
        return {"name": self.name, "max_seq_len": self.max_seq_len, "global_batch_size": self.batch(),
                "tokens": self.tokens, **self.extra}

    def comment(self) -> str:
        ran = " -> ".join(str(b) for b in dict.fromkeys(self.ran))
        if not self.estimates:
            return f"# {self.name}: ran at batch {ran}; no estimate in this stage: kept"
        values = [b for _, b in self.estimates]
        return (f"# {self.name}: ran at batch {ran}; measured critical batch {values[0]:.1f} -> {values[-1]:.1f} "
                f"({len(values)} estimates, granularity {self.granularity})")


def suggest_from_run(run: Path) -> tuple[list[StageSuggestion], int]:
    """(the stages suggested from RUN's records, the run's world size); UserError (naming the file or
    logging.noise_every) when RUN is no run directory or has no noise estimate."""
    run_dir = RunDir(Path(run))
    if not run_dir.stages.is_file():
        raise UserError(f"--from-run {run}: no {run_dir.stages.name} (not a run directory of `roformer pretrain`)")
    try:
        stages_doc = json.loads(run_dir.stages.read_text(encoding="utf-8"))
        rows, world_size = stages_doc["stages"], int(stages_doc["world_size"])
    except (ValueError, KeyError, TypeError) as err:
        raise UserError(f"--from-run {run}: {run_dir.stages} is not a stages.json of `roformer pretrain` ({err})") from None
    records = [r for r in read_records(run_dir.metrics) if r.get("kind") == "train"]
    noisy = [r for r in records if isinstance(r.get(NOISE_KEY), (int, float))]
    if not noisy:
        raise UserError(f"--from-run {run}: {run_dir.metrics.name} has no gradient noise estimate "
                        f"({NOISE_KEY}); train with logging.noise_every > 0 to measure the critical batch")
    model_theta = _model_rope_theta(run_dir)
    suggestions: dict[int, StageSuggestion] = {}
    piece_at: list[tuple[int, int, int, int]] = []  # (first_step, end_step, batch, stage index)
    for row in rows:
        index = row["index"]
        tokens = row["steps"] * row["global_batch_size"] * row["max_seq_len"]
        grain = row["micro_batch_size"] * world_size
        if index not in suggestions:
            extra = {key: row[key] for key in CARRIED_KEYS if row.get(key) is not None}
            if row.get("lr_scale", 1.0) != 1.0:
                extra["lr_scale"] = row["lr_scale"]
            if row.get("mixture"):
                extra["mixture"] = row["mixture"]
            if row.get("rope_theta") is not None and row["rope_theta"] != model_theta:
                extra["rope_theta"] = row["rope_theta"]
            suggestions[index] = StageSuggestion(row["name"], row["max_seq_len"], 0, grain, (), extra=extra)
        stage = suggestions[index]
        stage.tokens += tokens
        stage.granularity = min(stage.granularity, grain)
        stage.ran = (*stage.ran, row["global_batch_size"])
        piece_at.append((row["first_step"], row["first_step"] + row["steps"], row["global_batch_size"], index))
    for record in noisy:
        step = record["step"]  # steps completed: the estimate is of step `step`, i.e. index step - 1
        piece = next((p for p in piece_at if p[0] <= step - 1 < p[1]), None)
        if piece is None:
            continue
        index = record.get("stage", piece[3])
        # token slots before this step within its stage, from the schedule (records may predate schedule_tokens)
        before = sum((min(step - 1, end) - first) * batch * suggestions[i].max_seq_len
                     for first, end, batch, i in piece_at if i == index and first < step - 1)
        suggestions[index].estimates.append((before, float(record[NOISE_KEY])))
    return [suggestions[i] for i in sorted(suggestions)], world_size


def _model_rope_theta(run_dir: RunDir) -> float | None:
    try:
        config = yaml.safe_load(run_dir.config.read_text(encoding="utf-8"))
        return float(config["model"]["rope_theta"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def schedule_text(run: Path, stages: list[StageSuggestion], world_size: int) -> str:
    """The schedule file (YAML, configs/ schedules' format) with one comment line per stage saying why."""
    body = yaml.safe_dump({"description": f"batch ramps following the critical batch measured by {Path(run).name} "
                                          f"(roformer plan --from-run, world size {world_size})",
                           "stages": [s.entry() for s in stages]}, sort_keys=False, default_flow_style=None)
    header = [f"# Suggested by `roformer plan --from-run {run}`: the run's stage ends in token slots and, per stage,",
              "# a batch ramp following grad_noise_scale (B_simple, sequences). Check it with roformer plan --config.",
              *(s.comment() for s in stages)]
    return "\n".join(header) + "\n" + body

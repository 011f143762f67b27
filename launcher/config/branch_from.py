"""`branch_from` (`pretrain --branch-from RUN_DIR[:TAG]`): a new run that starts at another run's checkpoint
(weights, optimizer state, data position, RNG; default TAG: its newest complete one) and then follows its
own schedule, as a WSD user decays from several stable-phase checkpoints.

This module parses the key and compares schedules: up to the branch step every started stage and every
step's learning rate must be the source's (`schedule_difference`, `lr_difference`; micro-batch and
grad-accum may follow another world size). The checkpoint is read and checked by
launcher/checkpoint/resume.py (docs/training.md, "Branching a decay").
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from launcher.common.errors import UserError

WORLD_SIZE_FIELDS = ("index", "name", "micro_batch_size", "grad_accum_steps")
"""Fields of a resolved stage (stages.json) that may differ between a branch and its source: the
position, the label, and the split of the global batch, which follows the world size."""


@dataclass(frozen=True)
class BranchFrom:
    """RUN_DIR[:TAG] parsed."""

    run_dir: Path
    """The source run directory (absolute)."""
    tag: str | None
    """The checkpoint tag; None = the source's newest complete checkpoint."""

    @classmethod
    def parse(cls, value: str, source: str, base_dir: Path | None = None) -> "BranchFrom":
        """`RUN_DIR` or `RUN_DIR:TAG`; a relative RUN_DIR against `base_dir` (default: the working directory).
        A colon belongs to the tag only when what follows it holds no '/' (paths may contain colons)."""
        if not isinstance(value, str) or not value.strip():
            raise UserError(f"{source}: branch_from: expected RUN_DIR or RUN_DIR:TAG, got {value!r}")
        path, tag = value, None
        head, sep, tail = value.rpartition(":")
        if sep and head and tail and "/" not in tail:
            path, tag = head, tail
        if tag in (".", ".."):
            raise UserError(f"{source}: branch_from: {tag!r} is not a checkpoint tag")
        expanded = Path(os.path.expandvars(os.path.expanduser(path)))
        if not expanded.is_absolute():
            expanded = (base_dir or Path.cwd()) / expanded
        return cls(expanded.resolve(), tag)

    def __str__(self) -> str:
        return f"{self.run_dir}{f':{self.tag}' if self.tag else ''}"


def check_branch_target(cfg, run_dir: Path) -> None:
    """A branch is a new run directory: never its own source (which is only read)."""
    if cfg.branch_from and BranchFrom.parse(cfg.branch_from, cfg.source).run_dir == Path(run_dir).resolve():
        raise UserError(f"--run-dir {run_dir}: is the branch source itself (branch_from {cfg.branch_from}); a branch "
                        f"is a new run directory")


def schedule_difference(source: list[dict], new: list[dict], branch_step: int) -> str | None:
    """The first difference, in steps [0, branch_step), between two resolved stage lists (stages.json
    rows: name, max_seq_len, ..., first_step, steps), or None. Fields that follow the world size
    (WORLD_SIZE_FIELDS) are not compared, nor fields the source's record predates (an older release wrote
    no such key); a stage that runs past the branch step may end elsewhere."""
    for index, stage in enumerate(new):
        if stage["first_step"] >= branch_step:
            break
        label = f"stage {index + 1} ({stage['name']})"
        if index >= len(source):
            return f"{label}: not in the source run (it has {len(source)} stage{'s' * (len(source) != 1)})"
        theirs = source[index]
        for key in [k for k in stage if k in theirs and k not in WORLD_SIZE_FIELDS and k != "steps"]:
            if stage[key] != theirs[key]:
                return f"{label}: {key} {stage[key]!r} vs {theirs[key]!r} in the source run"
        mine_end = min(stage["first_step"] + stage["steps"], branch_step)
        their_end = min(theirs["first_step"] + theirs["steps"], branch_step)
        if mine_end != their_end:
            return (f"{label}: steps {stage['steps']} vs {theirs['steps']} in the source run (it ends at step "
                    f"{mine_end} vs {their_end})")
    return None


def lr_difference(source_optimizer: dict, source_stage_steps: list[int], optimizer, stage_steps: list[int],
                  branch_step: int) -> str | None:
    """The first optimizer step before `branch_step` whose learning rate (before the stage's lr_scale,
    compared with the stages) differs between the source's recorded optimizer section and this run's
    (launcher/config/schedule.py run_learning_rate: warmup, decay, WSD window), naming the optimizer fields
    that differ; None when the curves agree up to the branch."""
    import dataclasses

    from launcher.config.schedule import run_learning_rate

    mine = dataclasses.asdict(optimizer)
    for step in range(branch_step):
        a = run_learning_rate(step, optimizer, stage_steps)
        b = run_learning_rate(step, source_optimizer, source_stage_steps)
        if not _close(a, b):
            fields = [f"optimizer.{k} {mine[k]!r} vs {source_optimizer[k]!r}" for k in mine
                      if k in source_optimizer and mine[k] != source_optimizer[k]]
            if sum(stage_steps) != sum(source_stage_steps):
                fields.append(f"total steps {sum(stage_steps)} vs {sum(source_stage_steps)}")
            return (f"the learning rate of step {step} is {a:.6g} vs {b:.6g} in the source run "
                    f"({', '.join(fields) or 'same fields'})")
    return None


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-12 * max(abs(a), abs(b), 1e-30)

"""`branch_from` of a run config (`roformer pretrain --branch-from RUN_DIR[:TAG]`): a new run that starts at
another run's checkpoint, as a WSD user decays from several stable-phase checkpoints and keeps the best.

A branch is a resume whose checkpoint lives in another run directory: the new run starts at that
checkpoint's step with its weights, optimizer state, data position and RNG, then follows its own config's
schedule. Default TAG: the source's newest complete checkpoint. The checkpoint and the source's records are
read once (`find_branch_point`) and compared before any compute (`check_branch`, from
launcher/config/preflight_checks.py, so by `roformer plan`, `pretrain`, `--dry-run` and every rank); rank 0
verifies the checkpoint's files at start-up and refuses a damaged one, naming the file
(launcher/train/resume.py). What must hold:
  * the same model architecture (RoFormerConfig.diff) and the data's tokenizer is the checkpoint's
    (tokenizer_sha256), and the data position continues this data (corpus fingerprint, seed: at start-up);
  * the schedule up to the branch step is the source's (`schedule_difference`): every stage that started
    before it has the same first step and the same fields (any but name / micro-batch / grad-accum, which
    follow the world size; a branch may run on another number of ranks), and the learning rate of every
    step before it is the same (`lr_difference`). After the branch step the new config's stages and
    decay apply: that is the point of a branch.
The source is what it had in effect at the checkpoint's step (its records: launcher/run_dir/records.py).
It is only read: never written, never locked (a conversion to another shape goes into the new run's
universal/). The new run records where it came from in RUN_DIR/branch_from.json (records.py).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from launcher.errors import UserError
from launcher.io import file_sha256
from launcher.run_dir.checkpoint_catalogue import CheckpointCatalogue, CheckpointEntry
from launcher.run_dir.layout import RunDir, sidecar_path
from launcher.run_dir.records import files_in_effect, read_branch_record
from launcher.run_dir.sidecar import CheckpointSidecar, saved_model_config

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


@dataclass(frozen=True)
class BranchPoint:
    """The source checkpoint a branch starts from and the source's records in effect at its step: everything
    `check_branch` compares, read once (`find_branch_point`). Its files are verified by rank 0 at start-up
    (launcher/train/resume.py decide_branch)."""

    source: BranchFrom
    entry: CheckpointEntry
    """The source's checkpoint, complete at the sidecar level."""
    records: dict[str, Path]
    """kind -> the source's record file in effect at the checkpoint's step (records.files_in_effect)."""
    stages: list[dict]
    """The source's stages.json rows in effect then."""
    optimizer: dict
    """The optimizer section of the source's config in effect then."""
    record: dict
    """What the branch records in RUN_DIR/branch_from.json (records.write_branch_record)."""

    @property
    def tag(self) -> str:
        return self.entry.tag

    @property
    def step(self) -> int:
        return self.entry.step

    @property
    def sidecar(self) -> CheckpointSidecar:
        return self.entry.sidecar


def check_branch_target(cfg, run_dir: Path) -> None:
    """A branch is a new run directory: never its own source (which is only read)."""
    if cfg.branch_from and BranchFrom.parse(cfg.branch_from, cfg.source).run_dir == Path(run_dir).resolve():
        raise UserError(f"--run-dir {run_dir}: is the branch source itself (branch_from {cfg.branch_from}); a branch "
                        f"is a new run directory")


def find_branch_point(cfg, run_dir: Path | None = None) -> BranchPoint | None:
    """The point a start of `run_dir` branches from, read (`check_branch` compares it): None without
    `branch_from`, or once the branch has a complete checkpoint of its own (it resumes from those). A branch
    whose first start ended before its first checkpoint keeps the point it recorded in branch_from.json, even
    when the source has a newer checkpoint by now. UserError naming what is missing."""
    if not cfg.branch_from:
        return None
    branch = BranchFrom.parse(cfg.branch_from, cfg.source)
    if run_dir is not None:
        check_branch_target(cfg, run_dir)
        own = RunDir(Path(run_dir))
        if CheckpointCatalogue.scan(own).complete():
            return None
        recorded = read_branch_record(own)
        if recorded:
            branch = BranchFrom(branch.run_dir, recorded["tag"])
    return _read_branch_point(branch, cfg.source, cfg.branch_from)


def _read_branch_point(branch: BranchFrom, source: str, branch_from: str) -> BranchPoint:
    """The named checkpoint (complete), else the source's newest complete one, with the records in effect then."""
    layout = RunDir(branch.run_dir)
    where = f"{source}: branch_from {branch}"
    if not layout.root.is_dir():
        raise UserError(f"{where}: {layout.root} is not a run directory")
    catalogue = CheckpointCatalogue.scan(layout)  # sidecar level: rank 0 verifies the files
    complete = catalogue.complete()
    if branch.tag is None:
        if not complete:
            raise UserError(f"{where}: {layout.checkpoints} holds no complete checkpoint")
        entry = complete[-1]
    else:
        entry = catalogue.entry(branch.tag)
        if entry is None:
            raise UserError(f"{where}: no checkpoint {branch.tag!r} in {layout.checkpoints} (complete ones: "
                            f"{', '.join(e.tag for e in complete) or 'none'})")
        if entry.problem is not None:
            raise UserError(f"{where}: {entry.problem}")
    records = files_in_effect(layout, entry.step)
    record = {"source_run_dir": str(branch.run_dir), "tag": entry.tag, "step": entry.step,
              "stage": entry.sidecar.stage_name, "sidecar_sha256": file_sha256(sidecar_path(entry.path)),
              "source_config": str(records["config"]), "source_stages": str(records["stages"]),
              "branch_from": branch_from}
    return BranchPoint(branch, entry, records, _read_json(records["stages"]).get("stages") or [],
                       _read_yaml(records["config"]).get("optimizer") or {}, record)


def check_branch(cfg, stages: list, corpus, point: BranchPoint) -> None:
    """Everything about a branch that needs no process group (see the module docstring): UserError in one
    line naming the file, stage and field. `cfg`: RunConfig, `stages`: its ResolvedStages, `corpus`: the
    opened training data."""
    _check_model_and_data(cfg, point, corpus)
    if point.step >= cfg.schedule.total_steps:
        raise UserError(f"{cfg.source}: the schedule ends at step {cfg.schedule.total_steps}, at or before the branch "
                        f"point {point.tag} (step {point.step}): nothing to train")
    problem = schedule_difference(point.stages, [s.to_dict() for s in stages], point.step)
    where = f"{cfg.schedule.file} vs the branch source's {point.records['stages']}"
    if problem is None:
        problem = lr_difference(point.optimizer, [int(s["steps"]) for s in point.stages], cfg.optimizer,
                                [s.steps for s in stages], point.step)
        where = f"{cfg.source} vs the branch source's {point.records['config']}"
    if problem is not None:
        raise UserError(f"{where}: {problem}, before the branch step {point.step} ({point.tag}); a branch must "
                        f"follow its source's schedule up to that step")


def _check_model_and_data(cfg, point: BranchPoint, corpus) -> None:
    from roformer.config import ConfigError

    sidecar_file = sidecar_path(point.entry.path)
    try:
        saved = saved_model_config(point.entry.path, point.sidecar)
    except ConfigError as err:
        raise UserError(str(err)) from None
    differing = saved.diff(cfg.model)
    if differing:
        name = differing[0]
        raise UserError(f"{cfg.source}: model.{name} {getattr(cfg.model, name)!r} differs from "
                        f"{getattr(saved, name)!r} of the branch source ({sidecar_file}): a branch continues the "
                        f"same model")
    recorded = point.sidecar.tokenizer_sha256
    if recorded is not None and recorded != corpus.tokenizer_sha256:
        raise UserError(f"{cfg.source}: data.data_dir {corpus.data_dir} was tokenized with tokenizer "
                        f"{corpus.tokenizer_sha256[:12]}, the branch source {point.tag} with {recorded[:12]} "
                        f"({sidecar_file}): a branch continues on the source's data")
    trained = (point.sidecar.data_state or {}).get("corpus")
    if trained is not None and corpus.fingerprint != trained:
        raise UserError(f"{cfg.source}: data.data_dir {corpus.data_dir} is another corpus (fingerprint "
                        f"{corpus.fingerprint}) than the branch source trained on ({trained}, data_state.corpus in "
                        f"{sidecar_file}): a branch continues on the source's data")


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


def _read_json(path: Path) -> dict:
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserError(f"{path}: cannot read the branch source's record ({err})") from None
    if not isinstance(loaded, dict):
        raise UserError(f"{path}: not a record of a run")
    return loaded


def _read_yaml(path: Path) -> dict:
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise UserError(f"{path}: cannot read the branch source's record ({err})") from None
    return loaded if isinstance(loaded, dict) else {}

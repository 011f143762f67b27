"""`branch_from` of a run config (`roformer pretrain --branch-from RUN_DIR[:TAG]`): a new run that starts at
another run's checkpoint, as a WSD user decays from several stable-phase checkpoints and keeps the best.

A branch is a resume whose checkpoint lives in another run directory: the new run starts at that
checkpoint's step with its weights, optimizer state, data position and RNG, then follows its own config's
schedule. Default TAG: the source's newest complete checkpoint (rank 0 also verifies its files). What must
hold, checked before any compute (here: `check_branch`, from launcher/config/preflight_checks.py, so by
`roformer plan`, `pretrain`, `--dry-run` and every rank; the checkpoint's files by rank 0 at start-up,
launcher/train/resume.py):
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
from launcher.run_dir.checkpoint_catalogue import CheckpointCatalogue
from launcher.run_dir.layout import RunDir, sidecar_path
from launcher.run_dir.records import files_in_effect
from launcher.run_dir.sidecar import CheckpointSidecar, read_sidecar

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
    """The source checkpoint a branch starts from (its sidecar read, files not yet verified)."""

    source: BranchFrom
    directory: Path
    sidecar: CheckpointSidecar

    @property
    def tag(self) -> str:
        return self.sidecar.tag

    @property
    def step(self) -> int:
        return self.sidecar.step


def check_branch_target(cfg, run_dir: Path) -> None:
    """A branch is a new run directory: never its own source (which is only read)."""
    if cfg.branch_from and BranchFrom.parse(cfg.branch_from, cfg.source).run_dir == Path(run_dir).resolve():
        raise UserError(f"--run-dir {run_dir}: is the branch source itself (branch_from {cfg.branch_from}); a branch "
                        f"is a new run directory")


def find_branch_point(branch: BranchFrom, source: str) -> BranchPoint:
    """The named checkpoint (complete), else the source's newest complete one; UserError naming what is missing."""
    layout = RunDir(branch.run_dir)
    where = f"{source}: branch_from {branch}"
    if not layout.root.is_dir():
        raise UserError(f"{where}: {layout.root} is not a run directory")
    complete = CheckpointCatalogue.scan(layout).complete()  # sidecar level: rank 0 verifies the files
    if branch.tag is None:
        if not complete:
            raise UserError(f"{where}: {layout.checkpoints} holds no complete checkpoint")
        chosen = complete[-1]
        return BranchPoint(branch, chosen.path, chosen.sidecar)
    directory = layout.checkpoint(branch.tag)
    if not directory.is_dir():
        raise UserError(f"{where}: no checkpoint {branch.tag!r} in {layout.checkpoints} (complete ones: "
                        f"{', '.join(s.tag for s in complete) or 'none'})")
    return BranchPoint(branch, directory, read_sidecar(directory))


def check_branch(cfg, stages: list, corpus, tag: str | None = None) -> BranchPoint:
    """Everything about a branch that needs no process group (see the module docstring): UserError in one
    line naming the file, stage and field. `cfg`: RunConfig, `stages`: its ResolvedStages, `corpus`: the
    opened training data; `tag`: this checkpoint instead of branch_from's."""
    branch = BranchFrom.parse(cfg.branch_from, cfg.source)
    if tag is not None:
        branch = BranchFrom(branch.run_dir, tag)
    point = find_branch_point(branch, cfg.source)
    _check_model_and_data(cfg, point, corpus)
    if point.step >= cfg.schedule.total_steps:
        raise UserError(f"{cfg.source}: the schedule ends at step {cfg.schedule.total_steps}, at or before the branch "
                        f"point {point.tag} (step {point.step}): nothing to train")
    _check_schedule(cfg, stages, point)
    return point


def _check_model_and_data(cfg, point: BranchPoint, corpus) -> None:
    from roformer.config import ConfigError, RoFormerConfig

    sidecar_file = sidecar_path(point.directory)
    try:
        saved = RoFormerConfig.from_dict(point.sidecar.model_config, source=str(sidecar_file))
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


def _check_schedule(cfg, stages: list, point: BranchPoint) -> None:
    source_files = files_in_effect(RunDir(point.source.run_dir), point.step)
    source_stages = _read_json(source_files["stages"]).get("stages") or []
    where = f"{cfg.schedule.file} vs the branch source's {source_files['stages']}"
    problem = schedule_difference(source_stages, [s.to_dict() for s in stages], point.step)
    if problem is None:
        source_optimizer = (_read_yaml(source_files["config"]).get("optimizer") or {})
        problem = lr_difference(source_optimizer, [int(s["steps"]) for s in source_stages], cfg.optimizer,
                                [s.steps for s in stages], point.step)
        where = f"{cfg.source} vs the branch source's {source_files['config']}"
    if problem is not None:
        raise UserError(f"{where}: {problem}, before the branch step {point.step} ({point.tag}); a branch must "
                        f"follow its source's schedule up to that step")


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

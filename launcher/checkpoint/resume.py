"""Where a rank's start comes from: ONE object, the `ResumePlan`, which rank 0 decides before anything in
RUN_DIR is written and every rank then follows.

The rank's start-up (launcher/train/rank.py) is three steps; this module is the second:
  1. every rank checks its inputs: config, stages, run directory, data (nothing written);
  2. agree on the resume:
     a. rank 0 `decide`s: foreign checkpoints; the run's checkpoints (launcher/checkpoint/catalogue.py:
        every sidecar, then the newest complete checkpoint's files against the sizes and sha256 recorded at
        save time, a damaged one noted and the next older one tried); then the chosen one against this run
        (`plan_start`): model config, tokenizer, data position (corpus, format), and its shape (ZeRO
        stage, precision, world size: `load_route` picks DeepSpeed's own load or the universal checkpoint).
        A refusal is one line and exit code 2 right there, with the run directory exactly as it was;
     b. the process group starts and `share` hands rank 0's plan to every rank;
     c. rank 0 `accept`s it: the universal conversion, damaged checkpoints moved to checkpoints/damaged/ (one
        line each, saying where the run resumes instead), the record files (a config that differs from the
        run's becomes a new version: launcher/run_dir/records.py);
  3. every rank builds its components from the plan (engine, `Checkpointer.load(plan.source, ...)`, trainer).

A branch (`branch_from`, launcher/config/branch_from.py) is a first start whose source is a checkpoint of
another run directory, read (`find_branch_point`) and checked (`check_branch`) with the inputs (step 1):
`decide` verifies its files in place (read only: a damaged one is refused, never set aside), then the
same checks and route (`plan_start`), and RUN_DIR/branch_from.json is recorded.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import yaml

from data_pipeline import check_state_format
from data_pipeline.errors import DataError
from launcher.checkpoint.catalogue import (CheckpointCatalogue, CheckpointEntry, CheckpointSidecar, NewerSidecarFormat,
                                           move_aside, saved_model_config, verified)
from launcher.checkpoint.universal import convert_to_universal
from launcher.config.branch_from import BranchFrom, check_branch_target, lr_difference, schedule_difference
from launcher.config.run_config import RunConfig
from launcher.config.run_shape import RunShape
from launcher.config.schedule import stage_index_at
from launcher.config.stages import ResolvedStage
from launcher.common.errors import UserError
from launcher.common.io import file_sha256, write_line
from launcher.run_dir.layout import RunDir, sidecar_path
from launcher.run_dir.records import (BRANCH_FROM_RECORD, describe_change, files_in_effect, read_branch_record,
                                      record_start, write_branch_record)
from roformer.config import ConfigError, RoFormerConfig

# ZeRO stages whose checkpoints DeepSpeed loads into each other directly (same partitioned optimizer
# files), at the same world size and precision; every other change of shape goes through the universal
# checkpoint (DeepSpeed's ds_to_universal, completed for every stage by launcher/checkpoint/universal.py).
_INTERCHANGEABLE_ZERO_STAGES = frozenset({1, 2})


class StartSetup(Protocol):
    """What the resume reads of a rank's resolved setup (launcher/resolved/run_setup.py RunSetup, which checked
    it): nothing here reads the DeepSpeed JSON or resolves a stage again."""

    cfg: RunConfig
    stages: list[ResolvedStage]
    world_size: int
    ds_source: str
    shape: RunShape

    def ds_config(self, stage_index: int, load_universal: bool = False) -> dict: ...


@dataclass(frozen=True)
class ResumePlan:
    """Where this start of the run comes from, through which conversion, and what is recorded: decided by
    rank 0 (`decide`), the same on every rank after `share`, its writes carried out by rank 0 in `accept`.

    `source` None is a fresh start (the initialisation, or `init_from`'s weights); else a checkpoint of
    `source_run`: this run, or another one when branching, which is only read (its conversion goes to THIS
    run's universal/, none of its entries is set aside). `universal` (load_route): the load goes through the
    universal checkpoint. `accept` writes the config versions and moves `set_aside` aside; `notes` are the
    lines it said.
    """

    source: CheckpointEntry | None
    """The checkpoint the run continues from (None: a fresh start)."""
    source_run: RunDir | None
    """The run directory `source` belongs to (None on a fresh start)."""
    ds_config: dict
    """The DeepSpeed config the engine starts with (batch sizes of the starting stage; load_universal set when
    the route is the universal checkpoint). {} when `finished`."""
    universal: bool = False
    """The shape changed (`load_route`): load through RUN_DIR/universal/<tag>, converted in `accept`."""
    finished: bool = False
    """The source is at the end of the schedule: nothing to do."""
    init_from: Path | None = None
    """A fresh start's initial weights (cfg.init_from), None otherwise."""
    set_aside: tuple[CheckpointEntry, ...] = ()
    """This run's damaged checkpoints, moved to checkpoints/damaged/ once the plan is accepted."""
    notes: tuple[str, ...] = ()
    """What the start does besides loading: the route and the fp16 loss scaler on a change of shape (decided);
    after `accept`, also every line rank 0 said (damaged checkpoints set aside, a new config version)."""
    branch: dict | None = None
    """A branch's first start (`source_run` is the source): RUN_DIR/branch_from.json, written in `accept`."""

    @property
    def step(self) -> int:
        """Steps already done: where training continues."""
        return self.source.step if self.source is not None else 0

    def resumed_from(self, run_dir: RunDir) -> str | None:
        """The source as RUN_DIR's records name it: its tag, prefixed by its run directory when that is another."""
        if self.source is None:
            return None
        return self.source.tag if self.source_run == run_dir else f"{self.source_run.root}:{self.source.tag}"

    def universal_folder(self, run_dir: RunDir) -> Path | None:
        """Where the conversion of `source` is (always in the run that loads it), None for a direct load."""
        return run_dir.universal / self.source.tag if self.universal else None


@dataclass(frozen=True)
class BranchPoint:
    """The source checkpoint a branch starts from and the source's records in effect at its step: everything
    `check_branch` compares, read once (`find_branch_point`). Its files are verified by rank 0 at start-up
    (`decide`)."""

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


@dataclass(frozen=True)
class ScannedCheckpoints:
    """A branch's own checkpoints as the input checks scanned them (has it checkpoints of its own?), with the
    listing they came from. The checks run before the rank holds RUN_DIR, so `decide` takes this catalogue only
    while the listing is unchanged (a stat per checkpoint folder, no file read), else it scans again."""

    catalogue: CheckpointCatalogue
    listing: tuple

    @classmethod
    def scan(cls, run_dir: RunDir | Path) -> "ScannedCheckpoints":
        run_dir = run_dir if isinstance(run_dir, RunDir) else RunDir(Path(run_dir))
        listing = _listing(run_dir)  # first: a change during the scan then shows as a changed listing
        return cls(CheckpointCatalogue.scan(run_dir), listing)

    def current(self, run_dir: RunDir) -> CheckpointCatalogue:
        """The catalogue of RUN_DIR now: this one while nothing was saved, set aside or removed since."""
        return self.catalogue if _listing(run_dir) == self.listing else CheckpointCatalogue.scan(run_dir)


def _listing(run_dir: RunDir) -> tuple:
    """RUN_DIR's checkpoint folders with their sidecars' identity (a save writes the sidecar last)."""
    if not run_dir.checkpoints.is_dir():
        return ()
    rows = []
    for folder in run_dir.checkpoints.iterdir():
        try:
            stat = sidecar_path(folder).stat()
            rows.append((folder.name, stat.st_ino, stat.st_size, stat.st_mtime_ns))
        except OSError:
            rows.append((folder.name,))
    return tuple(sorted(rows))


def decide(run_dir: RunDir, setup: StartSetup, batches, branch_point: BranchPoint | None = None,
           scanned: ScannedCheckpoints | None = None) -> ResumePlan:
    """Rank 0: the plan of this start of RUN_DIR (its newest intact checkpoint, else a fresh start) and every
    check on it; UserError (nothing written) on a refusal. branch_point: the one the input checks found
    (launcher/inputs/run_checks.py), for a branch's first start; scanned: RUN_DIR's checkpoints as those checks
    scanned them (a branch's), reused while unchanged."""
    check_foreign_checkpoints(run_dir)
    catalogue = scanned.current(run_dir) if scanned is not None else CheckpointCatalogue.scan(run_dir)
    for newer in catalogue.newer():  # not damaged: refused as it is, never set aside
        raise NewerSidecarFormat(newer.problem)
    source = catalogue.newest_intact()
    damaged = tuple(catalogue.damaged())  # by their sidecars, or by the files of newer ones verification met
    if source is None and damaged:
        raise UserError(f"--run-dir {run_dir.root}: no intact checkpoint to resume from: "
                        + "; ".join(f"{d.tag}: {d.problem}" for d in damaged) + " (move them away to start over)")
    source_run, branch = run_dir, None
    if setup.cfg.branch_from and source is None:
        # A branch's first start (later starts resume from its own checkpoints): the point the input checks read
        # and checked, its files verified in place, then `plan_start` as for any resume. The source is only
        # read: a damaged checkpoint there is refused, naming the file, never set aside.
        if branch_point is None:  # the input checks saw checkpoints of this run that are gone now
            raise UserError(f"--run-dir {run_dir.root}: its checkpoints changed during start-up; start again")
        source = verified(branch_point.entry)
        if not source.verified:
            raise UserError(f"{setup.cfg.source}: branch_from {branch_point.source}: {source.problem}; branch from "
                            f"another of its checkpoints (RUN_DIR:TAG)")
        source_run, branch = RunDir(branch_point.source.run_dir), branch_point.record
    plan = plan_start(source, source_run, setup, batches, set_aside=damaged)  # damaged: none when branching
    if not plan.finished:
        catalogue.refuse_foreign_ahead(plan.step)  # a folder that is not ours where a save would write
    return dataclasses.replace(plan, branch=branch) if branch is not None else plan


def plan_start(source: CheckpointEntry | None, source_run: RunDir, setup: StartSetup, batches,
               set_aside: tuple[CheckpointEntry, ...] = ()) -> ResumePlan:
    """The plan of starting from intact checkpoint `source` of `source_run` (this run's or, branching, another's),
    or fresh when None: the checkpoint checked against this run (model, tokenizer, data position), the DeepSpeed
    config of the stage it continues in, the route to this run's shape."""
    cfg, step = setup.cfg, source.step if source is not None else 0
    if source is not None:
        check_compatible(source, cfg.model)  # first: another model's checkpoint is refused as that
        if step >= cfg.schedule.total_steps:
            return ResumePlan(source, source_run, {}, finished=True)
        check_tokenizer(source, batches.corpus)
        check_data_position(source, batches)
    start_stage = stage_index_at([stage.steps for stage in setup.stages], step)[0]
    if source is None:
        return ResumePlan(None, None, setup.ds_config(start_stage),
                          init_from=Path(cfg.init_from) if cfg.init_from else None)
    saved, now = RunShape.of_sidecar(source.sidecar), setup.shape
    universal = load_route(source, saved, now, setup.ds_source)
    return ResumePlan(source, source_run, setup.ds_config(start_stage, load_universal=universal), universal,
                      set_aside=set_aside,
                      notes=tuple(shape_notes(source, saved, now, universal)))


def check_foreign_checkpoints(run_dir: RunDir) -> None:
    """Refuse a run directory whose checkpoints/ holds DeepSpeed checkpoints we did not write.

    Every checkpoint of ours comes after RUN_DIR/config.yaml (written before the first step), so
    model-state files without it belong to something else; training there would mix two runs."""
    if run_dir.config.is_file():
        return
    foreign = sorted(d.name for d in run_dir.checkpoints.glob("*") if d.is_dir() and any(d.glob("*model_states.pt")))
    if foreign:
        raise UserError(f"--run-dir {run_dir.root}: checkpoints/ holds DeepSpeed checkpoints not written by "
                        f"`roformer pretrain` ({', '.join(foreign[:3])}; no config.yaml); use a new run directory")


def model_difference(point: CheckpointEntry, model_config: RoFormerConfig) -> tuple[RoFormerConfig, list[str]]:
    """The model `point` was trained with and the fields `model_config` differs in (ConfigError: its sidecar holds
    no model of this project). The one comparison of a resume's and a branch's model."""
    saved = saved_model_config(point.path, point.sidecar)
    return saved, saved.diff(model_config)


def tokenizer_difference(point: CheckpointEntry, corpus) -> str | None:
    """The tokenizer fingerprint `point` was trained with when the data's is another, else None (format-1 sidecars
    did not record it; their data position's corpus fingerprint covers it)."""
    recorded = point.sidecar.tokenizer_sha256
    return recorded if recorded is not None and recorded != corpus.tokenizer_sha256 else None


def check_compatible(point: CheckpointEntry, model_config: RoFormerConfig) -> None:
    """Refuse to resume a checkpoint of another model (names the differing fields)."""
    try:
        saved, differing = model_difference(point, model_config)
    except ConfigError as err:
        raise UserError(f"{point.path}: not a checkpoint of this project's model: {err}") from None
    if differing:
        details = ", ".join(f"{name}: checkpoint {getattr(saved, name)!r} vs config {getattr(model_config, name)!r}"
                            for name in differing)
        raise UserError(f"{point.path}: the checkpoint was trained with a different model; differing "
                        f"field(s): {details}. Use a new run directory or the checkpoint's model config.")


def check_tokenizer(point: CheckpointEntry, corpus) -> None:
    """The data's tokenizer must be the one the checkpoint was trained with (tokenizer_difference)."""
    recorded = tokenizer_difference(point, corpus)
    if recorded is not None:
        spm = corpus.data_dir / corpus.manifest["tokenizer"]["path"]
        raise UserError(f"{spm}: tokenizer sha256 {corpus.tokenizer_sha256} is not the one checkpoint {point.tag} "
                        f"was trained with ({recorded}, recorded in {sidecar_path(point.path)}); resume "
                        f"with the run's data dir or use a new run directory")


def check_data_position(point: CheckpointEntry, batches) -> None:
    """The checkpoint's data position must continue this corpus' stream (format, corpus, seed, ...)."""
    state = point.sidecar.data_state
    check_state_format(state)
    try:
        batches.check_state(state)
    except DataError as err:
        raise UserError(f"{sidecar_path(point.path)}: data_state does not fit data.data_dir "
                        f"{batches.corpus.data_dir}: {err}") from None


def load_route(point: CheckpointEntry, saved: RunShape, now: RunShape, ds_path: str) -> bool:
    """True: load through the universal checkpoint; False: DeepSpeed loads the checkpoint's own files.
    UserError only where DeepSpeed cannot carry the checkpoint to this shape at all."""
    if saved == now:
        return False
    if (saved.world_size, saved.precision) == (now.world_size, now.precision) and \
            {saved.zero_stage, now.zero_stage} <= _INTERCHANGEABLE_ZERO_STAGES:
        return False
    if saved.zero_stage == now.zero_stage == 0:
        # ZeRO-0 (fp32 only, see deepspeed_json.py) saves the whole optimizer state in one file that
        # every rank reads: another world size loads it directly.
        return False
    if 0 in (saved.zero_stage, now.zero_stage):
        raise UserError(f"{ds_path}: {now}, but checkpoint {point.tag} was saved with {saved} "
                        f"({sidecar_path(point.path)}); DeepSpeed carries a checkpoint to another ZeRO stage "
                        f"or precision only through its universal checkpoint, which needs ZeRO stage 1, 2 or 3 on "
                        f"both sides (ZeRO-0 keeps no partitioned optimizer state to convert): resume with "
                        f"zero_optimization.stage {saved.zero_stage} in {saved.precision}, or use a new run directory")
    return True


def shape_notes(point: CheckpointEntry, saved: RunShape, now: RunShape, universal: bool) -> list[str]:
    """One line on how the checkpoint is carried to the new shape, one on the fp16 loss scaler."""
    if saved == now:
        return []
    route = f"through the universal checkpoint universal/{point.tag}" if universal else "directly"
    notes = [f"checkpoint {point.tag} was saved with {saved}; this run is {now}: loaded {route}"]
    if now.precision == "fp16" and saved.precision != "fp16":
        notes.append(f"fp16 loss scaler: starts fresh (the checkpoint trained in {saved.precision}, "
                     f"without loss scaling)")
    elif saved.precision == "fp16" and now.precision != "fp16":
        notes.append(f"fp16 loss scaler: the checkpoint's (scale {point.sidecar.loss_scale:g}) is dropped: "
                     f"{now.precision} trains without loss scaling")
    return notes


# --------------------------------------------------------------------------- the branch point


def find_branch_point(cfg, run_dir: Path | None = None,
                      own: ScannedCheckpoints | None = None) -> BranchPoint | None:
    """The point a start of `run_dir` branches from, read (`check_branch` compares it): None without
    `branch_from`, or once the branch has a complete checkpoint of its own (it resumes from those). A branch
    whose first start ended before its first checkpoint keeps the point it recorded in branch_from.json, even
    when the source has a newer checkpoint by now. own: `run_dir`'s checkpoints as the caller scanned them
    (scanned here when None). UserError naming what is missing."""
    if not cfg.branch_from:
        return None
    branch = BranchFrom.parse(cfg.branch_from, cfg.source)
    if run_dir is not None:
        check_branch_target(cfg, run_dir)
        own_run = RunDir(Path(run_dir))
        if (own or ScannedCheckpoints.scan(own_run)).catalogue.complete():
            return None
        recorded = read_branch_record(own_run)
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
    sidecar_file = sidecar_path(point.entry.path)
    try:
        saved, differing = model_difference(point.entry, cfg.model)
    except ConfigError as err:
        raise UserError(str(err)) from None
    if differing:
        name = differing[0]
        raise UserError(f"{cfg.source}: model.{name} {getattr(cfg.model, name)!r} differs from "
                        f"{getattr(saved, name)!r} of the branch source ({sidecar_file}): a branch continues the "
                        f"same model")
    recorded = tokenizer_difference(point.entry, corpus)
    if recorded is not None:
        raise UserError(f"{cfg.source}: data.data_dir {corpus.data_dir} was tokenized with tokenizer "
                        f"{corpus.tokenizer_sha256[:12]}, the branch source {point.tag} with {recorded[:12]} "
                        f"({sidecar_file}): a branch continues on the source's data")
    trained = (point.sidecar.data_state or {}).get("corpus")
    if trained is not None and corpus.fingerprint != trained:
        raise UserError(f"{cfg.source}: data.data_dir {corpus.data_dir} is another corpus (fingerprint "
                        f"{corpus.fingerprint}) than the branch source trained on ({trained}, data_state.corpus in "
                        f"{sidecar_file}): a branch continues on the source's data")


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


# --------------------------------------------------------------------------- all ranks


def share(plan: ResumePlan | None) -> ResumePlan:
    """Every rank gets rank 0's plan (call on all ranks once the process group started; None off rank 0)."""
    import deepspeed.comm as dist  # here: the plan's checks also run in `roformer plan`, without DeepSpeed

    box = [plan]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def accept(plan: ResumePlan, run_dir: RunDir, setup: StartSetup, rank: int, config: dict) -> ResumePlan:
    """All ranks, once the plan is shared: rank 0 converts for this shape, sets damaged checkpoints aside and
    records the config (`config`: setup.cfg.to_dict(), made once by the rank), the others wait. Returns the plan
    with every line rank 0 said as its notes."""
    import deepspeed.comm as dist

    if rank == 0:
        plan = dataclasses.replace(plan, notes=tuple(_carry_out(plan, run_dir, setup, config)))
    dist.barrier()
    return plan


def stages_record(cfg, world_size: int, stages: list) -> dict:
    """RUN_DIR/stages.json's content: the resolved stages (a ramp's pieces each a row) at `world_size`, and for a
    schedule written in tokens `schedule_unit: tokens` (the report's x axis; schedules in steps record what they
    always did)."""
    return {"world_size": world_size, "stages": [s.to_dict() for s in stages],
            **({"schedule_unit": "tokens"} if cfg.schedule.in_tokens else {})}


def _carry_out(plan: ResumePlan, run_dir: RunDir, setup: StartSetup, config: dict) -> list[str]:
    """Rank 0: the plan's writes, all into RUN_DIR (a branch's source run is only read)."""
    notes = list(plan.notes)
    if plan.universal:
        convert_to_universal(plan.source, run_dir)
    for damaged in plan.set_aside:
        dest = move_aside(run_dir, damaged.path)
        notes.append(f"checkpoint {damaged.tag} is damaged ({damaged.problem}); moved to {dest}; resuming from "
                     f"{plan.source.tag} (step {plan.step})")
    if plan.branch is not None:
        write_branch_record(run_dir, plan.branch)
        notes.append(f"a branch of {plan.source_run.root}: starts at {plan.source.tag} (step {plan.step}); "
                     f"recorded in {run_dir.root / BRANCH_FROM_RECORD}")
    records = {"config": config, "ds_config": plan.ds_config,
               "stages": stages_record(setup.cfg, setup.world_size, setup.stages)}
    version = record_start(run_dir, records, plan.step, plan.resumed_from(run_dir))
    if version is not None and version.version > 1:
        notes.append(describe_change(run_dir, version))
    for note in notes:
        write_line(f"pretrain: {note}")
    return notes

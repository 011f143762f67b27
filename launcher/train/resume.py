"""Where a (re)started run continues: rank 0 decides, every rank follows, and nothing in RUN_DIR is
written before the decision is final.

The order (launcher/train/rank_entry.py):
  1. every rank checks its input: config, stages, run directory, data (rank 0 hashes what needs it);
  2. rank 0 `decide`s: foreign checkpoints; every checkpoint's sidecar; the newest complete
     checkpoint's files against the sizes and sha256 recorded at save time (a damaged one is noted
     and the next older one tried); then the chosen one against this run: model config, tokenizer,
     data position (corpus, format), and its shape (ZeRO stage, precision, world size: `load_route`
     picks DeepSpeed's own load or the universal checkpoint). A refusal is one line and exit code 2
     right there, with the run directory exactly as it was;
  3. the process group starts and `share` hands rank 0's verdict to every rank;
  4. rank 0 `accept`s it: universal conversion, damaged checkpoints moved to checkpoints/damaged/
     (one line each, saying where the run resumes instead), the record files (a config that
     differs from the run's becomes a new version: launcher/run_dir/records.py).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

import deepspeed.comm as dist

from data_pipeline import check_state_format
from data_pipeline.errors import DataError
from launcher.run_dir.checkpoint_catalogue import CheckpointCatalogue, CheckpointEntry
from launcher.run_dir.checkpoint_files import move_aside
from launcher.config.deepspeed_json import resolve_ds_config
from launcher.config.precision import train_precision
from launcher.config.preflight_checks import ds_config_source
from launcher.config.run_config import RunConfig
from launcher.config.stages import ResolvedStage
from launcher.errors import UserError
from launcher.run_dir.layout import RunDir, sidecar_path
from launcher.run_dir.records import describe_change, record_start
from launcher.run_dir.sidecar import NewerSidecarFormat
from launcher.train.checkpointer import check_compatible, check_foreign_checkpoints, convert_to_universal

# ZeRO stages whose checkpoints DeepSpeed loads into each other directly (same partitioned optimizer
# files), at the same world size and precision; every other change of shape goes through the universal
# checkpoint (DeepSpeed's ds_to_universal, completed for every stage by launcher/train/universal_folder.py).
_INTERCHANGEABLE_ZERO_STAGES = frozenset({1, 2})


@dataclass(frozen=True)
class RunShape:
    """How DeepSpeed partitions and types a run's checkpoint files (besides the model itself)."""

    zero_stage: int
    """zero_optimization.stage: 0, 1, 2 or 3."""
    precision: str
    """fp32, fp16 or bf16 (launcher/config/precision.py)."""
    world_size: int
    """Data-parallel ranks."""

    @classmethod
    def of_config(cls, ds_config: dict, world_size: int, source: str) -> "RunShape":
        stage = int((ds_config.get("zero_optimization") or {}).get("stage", 0))
        return cls(stage, train_precision(ds_config, source), world_size)

    @classmethod
    def of_checkpoint(cls, point: CheckpointEntry) -> "RunShape":
        saved = point.sidecar
        return cls(saved.zero_stage, saved.precision, saved.world_size)

    def __str__(self) -> str:
        return f"ZeRO-{self.zero_stage}, {self.precision}, {self.world_size} rank{'s' if self.world_size > 1 else ''}"


@dataclass
class ResumeDecision:
    """Rank 0's verdict, the same on every rank after `share`."""

    point: CheckpointEntry | None
    """The newest intact checkpoint (None: a fresh start)."""
    ds_config: dict
    """The DeepSpeed config the engine starts with (batch sizes of the starting stage)."""
    universal: bool = False
    """The shape changed (`load_route`): load through RUN_DIR/universal/<tag>."""
    finished: bool = False
    """The point is at the end of the schedule: nothing to do."""
    damaged: list[CheckpointEntry] = field(default_factory=list)
    """Checkpoints to move aside once the resume is accepted."""
    shape_notes: list[str] = field(default_factory=list)
    """What a change of shape does (the route, the fp16 loss scaler), said once the resume is accepted."""


def decide(run_dir: RunDir, cfg: RunConfig, stages: list[ResolvedStage], world_size: int, batches) -> ResumeDecision:
    """Rank 0: the resume point and every check on it; UserError (nothing written) on a refusal."""
    check_foreign_checkpoints(run_dir)
    catalogue = CheckpointCatalogue.scan(run_dir)
    for newer in catalogue.newer():  # not damaged: refused as it is, never set aside
        raise NewerSidecarFormat(newer.problem)
    point = catalogue.newest_intact()
    damaged = catalogue.damaged()  # by their sidecars, or by the files of newer ones verification met
    if point is None:
        if damaged:
            raise UserError(f"--run-dir {run_dir.root}: no intact checkpoint to resume from: "
                            + "; ".join(f"{d.tag}: {d.problem}" for d in damaged)
                            + " (move them away to start over)")
        return ResumeDecision(None, resolve_ds_config(cfg, stages[0], world_size))
    check_compatible(point, cfg.model)
    if point.sidecar.step >= cfg.schedule.total_steps:
        return ResumeDecision(point, {}, finished=True, damaged=damaged)
    check_tokenizer(point, batches.corpus)
    check_data_position(point, batches)
    start_stage = stages[cfg.schedule.stage_for_step(point.sidecar.step)[0]]
    ds_config = resolve_ds_config(cfg, start_stage, world_size)
    saved, now = RunShape.of_checkpoint(point), RunShape.of_config(ds_config, world_size, ds_config_source(cfg))
    universal = load_route(point, saved, now, ds_config_source(cfg))
    if universal:
        ds_config = resolve_ds_config(cfg, start_stage, world_size, load_universal=True)
    return ResumeDecision(point, ds_config, universal, damaged=damaged,
                          shape_notes=shape_notes(point, saved, now, universal))


def check_tokenizer(point: CheckpointEntry, corpus) -> None:
    """The data's tokenizer must be the one the checkpoint was trained with (format-1 sidecars did
    not record it; their data position's corpus fingerprint covers it)."""
    recorded = point.sidecar.tokenizer_sha256
    if recorded is not None and recorded != corpus.tokenizer_sha256:
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


def share(decision: ResumeDecision | None) -> ResumeDecision:
    """Every rank gets rank 0's decision (call on all ranks after the process group started)."""
    box = [decision]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def accept(decision: ResumeDecision, run_dir: RunDir, cfg: RunConfig, stages: list[ResolvedStage],
           world_size: int, rank: int) -> list[str]:
    """All ranks, once the decision is shared: rank 0 converts for this world size, sets damaged
    checkpoints aside and records the config, the others wait. Returns the lines rank 0 printed."""
    notes = _accept_on_rank0(decision, run_dir, cfg, stages, world_size) if rank == 0 else []
    dist.barrier()
    return notes


def _accept_on_rank0(decision: ResumeDecision, run_dir: RunDir, cfg: RunConfig, stages: list[ResolvedStage],
                     world_size: int) -> list[str]:
    point, notes = decision.point, list(decision.shape_notes)
    if decision.universal:
        convert_to_universal(point, run_dir)
    for damaged in decision.damaged:
        dest = move_aside(run_dir, damaged.path)
        notes.append(f"checkpoint {damaged.tag} is damaged ({damaged.problem}); moved to {dest}; resuming from "
                     f"{point.tag} (step {point.sidecar.step})")
    records = {"config": cfg.to_dict(), "ds_config": decision.ds_config,
               "stages": {"world_size": world_size, "stages": [s.to_dict() for s in stages]}}
    version = record_start(run_dir, records, point.sidecar.step if point else 0, point.tag if point else None)
    if version is not None and version.version > 1:
        notes.append(describe_change(run_dir, version))
    for note in notes:
        print(f"pretrain: {note}", file=sys.stderr, flush=True)
    return notes

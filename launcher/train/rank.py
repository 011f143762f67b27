"""One rank of pretraining, started by launcher.train.rank_entry (which holds the run directory for it):
its start-up in three steps, then training.

    inputs = check_inputs(argv)            # 1. config, stages, run directory, data: nothing written, no process group
    plan = agree_on_resume(inputs, ...)    # 2. rank 0 decides, the process group starts, every rank gets ONE
                                           #    ResumePlan (launcher/checkpoint/resume.py), rank 0 carries out its writes
    started = build_components(inputs, plan, ...)  # 3. engine, checkpointer (loads the plan's source), trainer
    run(started)                           # to the end of the schedule or a stop
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

from data_pipeline import PretrainBatches
from launcher.checkpoint import resume
from launcher.checkpoint.checkpointer import Checkpointer, loss_scale
from launcher.checkpoint.resume import BranchPoint, ResumePlan
from launcher.config.run_config import RunConfig
from launcher.config.stages import ResolvedStage, resolve_stages
from launcher.defaults import GUARD_STOP_EXIT_CODE, ORDERLY_STOP_EXIT_CODE, RANK_ERROR_PREFIX
from launcher.errors import UserError
from launcher.inputs.init_from import load_run_config
from launcher.inputs.run_checks import check_data, check_deepspeed_configs, open_streams
from launcher.report.hook import PlotHook
from launcher.run_dir.layout import RunDir
from launcher.run_dir.records import write_init_record
from launcher.train.engine import build_engine, init_distributed, precision
from launcher.train.heartbeats import HeartbeatWriter
from launcher.train.init_weights import InitialWeights
from launcher.tracking.attach import sync_run
from launcher.tracking.remote import final_files
from launcher.tracking.open_sinks import tracked_run
from launcher.train.metrics import Metrics
from launcher.train.phase_timer import PhaseTimer
from launcher.train.progress_line import progress_every
from launcher.train.stop_signals import THIS_RANK, StopAnnouncer, StopSignals
from launcher.train.trainer import Trainer, TrainState
from launcher.stage_evals.start import stage_end_callback


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m launcher.train.rank_entry", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="run config YAML")
    parser.add_argument("--run-dir", required=True, help="run directory (created; resumed when it holds checkpoints)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # added by DeepSpeed
    return parser.parse_args(argv)


@dataclass(frozen=True)
class RankInputs:
    """Everything a rank starts from, checked (step 1): nothing is written and no process group exists yet."""

    cfg: RunConfig
    rank: int
    world_size: int
    stages: list[ResolvedStage]
    """The schedule's stages at this world size."""
    run_dir: RunDir
    """Checked, not created (the rank entry creates and holds it: lock.held_run_dir)."""
    train_batches: PretrainBatches
    """This rank's training stream (data checked: launcher/inputs/run_checks.py)."""
    valid_batches: PretrainBatches
    branch_point: BranchPoint | None = None
    """The branch point of `branch_from`, checked with the inputs (None: no branch, or one already started)."""


@dataclass
class StartedRank:
    """A rank ready for its first (or resumed) step: what `run` runs, and a benchmark drives step by step."""

    trainer: Trainer
    metrics: Metrics
    progress: HeartbeatWriter
    plots: PlotHook | None
    """Rank 0's RUN_DIR/plots renderer (None on the other ranks and with `logging.plots: false`)."""
    run_dir: RunDir
    stop_signals: StopSignals
    """SIGTERM / SIGINT, recorded from the rank's start: the stop requests the trainer reads every step."""


def check_inputs(argv: list[str] | None) -> RankInputs:
    """Step 1: the command line, this rank's place, the run directory, the run config, the stages at this world
    size and the data, with every check `roformer plan` and `--dry-run` run too
    (launcher/inputs/run_checks.py: each stage's DeepSpeed config through DeepSpeed's own parser and against this accelerator,
    the data and its tokenizer against model.vocab_size, each stage against the corpus size). Shard content
    is verified once, by rank 0 (re-hashing only shards changed since they were written:
    data_pipeline/shards.py); the others check structure and sizes. UserError / DataError, one line, before
    anything is written and before any process group exists. The stage-end evals were checked by the launch
    plan that started the ranks (launcher/launch/launch_plan.py), once per job and restart, not per rank."""
    args = parse_args(argv)
    rank, world_size = rank_and_world_size()
    run_dir = check_run_dir(Path(args.run_dir))
    cfg = load_run_config(args.config, args.overrides)
    stages = resolve_stages(cfg, world_size)
    check_deepspeed_configs(cfg, stages, world_size)
    train, valid = open_streams(cfg, rank, world_size, verify=cfg.data.verify and rank == 0)  # this rank's, kept
    findings = check_data(cfg, stages, train, run_dir.root)
    return RankInputs(cfg, rank, world_size, stages, run_dir, train, valid, findings.branch)


def check_run_dir(path: Path) -> RunDir:
    """RUN_DIR checked, nothing written: an existing one must be a directory this rank may write (access(2),
    which also sees a read-only mount; a refused resume leaves it exactly as it was, down to its mtime); a new
    one needs an existing parent (the rank entry creates it: lock.held_run_dir)."""
    root = path.expanduser().resolve()
    if root.exists() and not root.is_dir():
        raise UserError(f"--run-dir {root}: exists and is not a directory")
    if not root.parent.is_dir():
        raise UserError(f"--run-dir {root}: parent directory {root.parent} does not exist")
    if root.is_dir() and not os.access(root, os.W_OK | os.X_OK):
        raise UserError(f"--run-dir {root}: not writable")
    return RunDir(root)


def start(inputs: RankInputs, timer: PhaseTimer) -> StartedRank | None:
    """Steps 2 and 3, once the rank entry holds the run directory (launcher/train/rank_entry.py); None when
    the run is already at the end of its schedule."""
    progress = HeartbeatWriter(inputs.run_dir, inputs.rank, inputs.cfg.watchdog)  # heartbeats for the hang watchdog
    progress.start_up("resume checks")
    plan = agree_on_resume(inputs, progress, timer)
    if plan.finished:
        if inputs.rank == 0:  # first what its trackers missed (a server down when it finished), as promised
            sync_run(inputs.run_dir, final_files(inputs.run_dir),
                     **tracked_run(inputs.cfg.to_dict(), inputs.run_dir, inputs.cfg.data.data_dir,
                                   inputs.cfg.logging.report_to))
            print(f"{inputs.run_dir.root}: already trained to the end of the schedule (step {plan.step}); "
                  "nothing to do", file=sys.stderr)
        return None
    return build_components(inputs, plan, progress, timer)


def agree_on_resume(inputs: RankInputs, progress: HeartbeatWriter, timer: PhaseTimer) -> ResumePlan:
    """Step 2: rank 0 decides where the run starts (writing nothing: a refusal leaves RUN_DIR as it was), the
    process group starts, every rank gets rank 0's plan, and (unless there is nothing left to train) rank 0
    carries out its writes: the conversion, damaged checkpoints set aside, the record files."""
    cfg, rank, world_size = inputs.cfg, inputs.rank, inputs.world_size
    decided = None  # off rank 0: rank 0's plan arrives in `share`
    if rank == 0:
        decided = resume.decide(inputs.run_dir, cfg, inputs.stages, world_size, inputs.train_batches,
                                inputs.branch_point)
    timer.phase("checks_and_data")
    progress.start_up("rendezvous (init_distributed)")
    init_distributed()
    timer.phase("init_distributed")
    plan = resume.share(decided)
    if plan.finished:
        return plan
    progress.start_up("run files and conversion")
    plan = resume.accept(plan, inputs.run_dir, cfg, inputs.stages, world_size, rank)
    timer.phase("run_files_and_conversion")
    return plan


def build_components(inputs: RankInputs, plan: ResumePlan, progress: HeartbeatWriter,
                     timer: PhaseTimer) -> StartedRank:
    """Step 3: the engine (init_from's weights on a fresh start), the checkpointer (which loads the plan's
    source), metrics, plots and the trainer."""
    cfg, rank, world_size, run_dir = inputs.cfg, inputs.rank, inputs.world_size, inputs.run_dir
    # Raised by DeepSpeed's ZeRO all-gather on every step with recent torch; nothing for a user to do.
    warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*", category=FutureWarning)
    progress.start_up("engine")
    initial = InitialWeights.read(plan.init_from, cfg.model) if plan.init_from is not None else None
    engine = build_engine(cfg, plan.ds_config, rank, initial)
    if initial is not None and rank == 0:
        write_init_record(run_dir, initial.record())
    timer.phase("engine")
    state = TrainState()
    checkpointer = Checkpointer(run_dir, engine, state, inputs.train_batches, model_config=cfg.model, rank=rank,
                                world_size=world_size, keep_last=cfg.checkpoint.keep_last,
                                total_steps=cfg.schedule.total_steps,
                                tokenizer_sha256=inputs.train_batches.corpus.tokenizer_sha256)
    if plan.source is not None:
        progress.start_up("checkpoint load")
        checkpointer.load(plan.source, cfg.seed, plan.universal_folder(run_dir))
        timer.phase("checkpoint_load")
    metrics = Metrics(run_dir, rank, inputs.stages, cfg.schedule.total_steps, state.step, cfg.logging.log_every,
                      cfg.logging.progress_bar, progress_every(cfg.logging.progress_every, cfg.schedule.total_steps),
                      preemption_grace=cfg.restarts.preemption_grace_seconds,
                      **tracked_run(cfg.to_dict(), run_dir, cfg.data.data_dir, cfg.logging.report_to))
    plots = PlotHook(run_dir, cfg.schedule.total_steps, metrics.message) if rank == 0 and cfg.logging.plots else None
    on_stage_end = stage_end_callback(cfg, run_dir, plots)
    metrics.report_start(timer, plan, world_size, loss_scale(engine), int(engine.skipped_steps), precision(engine),
                         cfg.logging.peak_tflops)
    signals = THIS_RANK
    trainer = Trainer(cfg, inputs.stages, engine, inputs.train_batches, inputs.valid_batches, state, checkpointer,
                      metrics, on_stage_end=on_stage_end, progress=progress,
                      stop_requested=lambda: signals.requested is not None)
    return StartedRank(trainer, metrics, progress, plots, run_dir, signals)


def run(started: StartedRank) -> int:
    """trainer.run() to the end of the schedule or a stop; the rank's exit code."""
    trainer, metrics, progress, plots = started.trainer, started.metrics, started.progress, started.plots
    started.stop_signals.arm(StopAnnouncer(trainer.cfg.restarts.preemption_grace_seconds, trainer.rank,
                                           lambda text: metrics.message(text, kept=True),
                                           lambda: trainer.state.step + 1))
    outcome = trainer.run()
    progress.ended(outcome, trainer.state.step)
    metrics.event(outcome, step=trainer.state.step)
    if plots is not None:  # RUN_DIR/plots complete when a finished run returns; a stop does not wait
        plots.run_end(trainer.state.step, wait=outcome == "finished")
    if outcome == "guard_stopped":  # its own error line, last: step, figure, median, threshold, resume point
        metrics.message(RANK_ERROR_PREFIX.format(rank=trainer.rank) + trainer.guard_stop.line)
    else:
        metrics.message(f"{outcome} at step {trainer.state.step}; checkpoints in {started.run_dir.checkpoints}",
                        kept=outcome != "finished")
    metrics.close()
    return {"finished": 0, "guard_stopped": GUARD_STOP_EXIT_CODE}.get(outcome, ORDERLY_STOP_EXIT_CODE)


def rank_and_world_size() -> tuple[int, int]:
    try:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        raise UserError("RANK / WORLD_SIZE are not set: start this through `roformer pretrain` "
                        "(DeepSpeed's launcher), not directly") from None

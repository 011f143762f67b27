"""One rank of pretraining, started by launcher.train.rank_entry (which holds the run directory for it):
its start-up in three steps, then training.

    setup = check_inputs(argv)             # 1. config, stages, run directory, data, resolved once into a RankSetup:
                                           #    nothing written, no process group
    plan = agree_on_resume(setup, ...)     # 2. rank 0 decides, the process group starts, every rank gets ONE
                                           #    ResumePlan (launcher/checkpoint/resume.py), rank 0 carries out its writes
    started = build_components(setup, plan, ...)  # 3. engine, checkpointer (loads the plan's source), trainer
    run(started)                           # to the end of the schedule or a stop
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

from launcher.checkpoint import resume
from launcher.checkpoint.checkpointer import CheckpointedRun, Checkpointer
from launcher.checkpoint.resume import ResumePlan
from launcher.config.deepspeed_json import DeepSpeedJson
from launcher.config.stages import stage_ends
from launcher.common.defaults import GUARD_STOP_EXIT_CODE, ORDERLY_STOP_EXIT_CODE, RANK_ERROR_PREFIX
from launcher.deepspeed_env.engine_state import loss_scale
from launcher.common.errors import UserError
from launcher.common.stop_mask import stops_held
from launcher.inputs.run_checks import check_data, open_streams
from launcher.resolved.init_from import load_config_and_init
from launcher.resolved.rank_setup import RankSetup
from launcher.resolved.run_setup import resolve_setup
from launcher.resolved.run_stages import stages_at
from launcher.report.hook import PlotHook
from launcher.run_dir.layout import RunDir
from launcher.run_dir.records import write_init_record
from launcher.deepspeed_env.process_group import init_distributed
from launcher.train.engine import build_engine
from launcher.train.guard_actions import GuardActions
from launcher.train.heartbeats import HeartbeatWriter
from launcher.train.init_weights import InitialWeights
from launcher.tracking.attach import sync_run
from launcher.tracking.open_sinks import TrackedRun, tracked_run
from launcher.tracking.remote import final_files
from launcher.train.metrics import Metrics, MetricsOptions
from launcher.train.noise_probe import NoiseProbe
from launcher.train.phase_timer import PhaseTimer
from launcher.train.read_ahead import ReadAhead
from launcher.train.stop_signals import THIS_RANK, StopAnnouncer, StopSignals
from launcher.train.trainer import Trainer, TrainerHooks, TrainParts, TrainState
from launcher.stage_evals.start import stage_end_callback


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m launcher.train.rank_entry", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="run config YAML")
    parser.add_argument("--run-dir", required=True, help="run directory (created; resumed when it holds checkpoints)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # added by DeepSpeed
    return parser.parse_args(argv)


@dataclass
class StartedRank:
    """A rank ready for its first (or resumed) step: what `run` runs, and a benchmark drives step by step."""

    trainer: Trainer
    metrics: Metrics
    heartbeats: HeartbeatWriter
    plots: PlotHook | None
    """Rank 0's RUN_DIR/plots renderer (None on the other ranks and with `logging.plots: false`)."""
    run_dir: RunDir
    stop_signals: StopSignals
    """SIGTERM / SIGINT, recorded from the rank's start: the stop requests the trainer reads every step."""


def check_inputs(argv: list[str] | None) -> RankSetup:
    """Step 1: the command line, this rank's place, the run directory, the run config (with its init_from
    directory, read once), the stages at this world size and the data, with every check `roformer plan` and
    `--dry-run` run too (launcher/resolved/run_setup.py: each stage's DeepSpeed config, read once, through
    DeepSpeed's own parser and against this accelerator; launcher/inputs/run_checks.py: the data and its tokenizer
    against model.vocab_size, each stage against the corpus size). Shard content
    is verified once, by rank 0 (re-hashing only shards changed since they were written:
    data_pipeline/shards.py); the others check structure and sizes. UserError / DataError, one line, before
    anything is written and before any process group exists. The stage-end evals were checked by the launch
    plan that started the ranks (launcher/launch/launch_plan.py), once per job and restart, not per rank."""
    args = parse_args(argv)
    rank, world_size = rank_and_world_size()
    run_dir = check_run_dir(Path(args.run_dir))
    cfg, init = load_config_and_init(args.config, args.overrides)
    ds_json = DeepSpeedJson.of(cfg)  # read once: micro_batch_size auto's memory plan and every stage's config
    stages = stages_at(cfg, world_size, ds_json)  # micro_batch_size auto: this rank's device
    setup, _ = resolve_setup(cfg, init, stages, world_size, ds_json=ds_json)
    train, valid = open_streams(cfg, rank, world_size, verify=cfg.data.verify and rank == 0)  # this rank's, kept
    findings = check_data(setup, train, run_dir.root)
    return RankSetup(setup, rank, run_dir, train, valid, findings.branch, findings.own_checkpoints)


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


def start(setup: RankSetup, timer: PhaseTimer) -> StartedRank | None:
    """Steps 2 and 3, once the rank entry holds the run directory (launcher/train/rank_entry.py); None when
    the run is already at the end of its schedule."""
    heartbeats = HeartbeatWriter(setup.run_dir, setup.rank, setup.cfg.watchdog)  # for the hang watchdog
    heartbeats.start_up("resume checks")
    config = setup.cfg.to_dict()  # once: recorded in RUN_DIR (rank 0) and the trackers' parameters
    plan = agree_on_resume(setup, heartbeats, timer, config)
    tracking = tracked_run(config, setup.run_dir, setup.cfg.data.data_dir, setup.cfg.logging.report_to)
    if plan.finished:
        if setup.rank == 0:  # first what its trackers missed (a server down when it finished), as promised
            sync_run(setup.run_dir, final_files(setup.run_dir), tracking, stage_ends(setup.run.stages))
            print(f"{setup.run_dir.root}: already trained to the end of the schedule (step {plan.step}); "
                  "nothing to do", file=sys.stderr)
        return None
    return build_components(setup, plan, heartbeats, timer, tracking)


def agree_on_resume(setup: RankSetup, heartbeats: HeartbeatWriter, timer: PhaseTimer, config: dict) -> ResumePlan:
    """Step 2: rank 0 decides where the run starts (writing nothing: a refusal leaves RUN_DIR as it was), the
    process group starts, every rank gets rank 0's plan, and (unless there is nothing left to train) rank 0
    carries out its writes: the conversion, damaged checkpoints set aside, the record files."""
    decided = None  # off rank 0: rank 0's plan arrives in `share`
    if setup.rank == 0:
        decided = resume.decide(setup.run_dir, setup.run, setup.train_batches, setup.branch_point,
                                setup.own_checkpoints)
    timer.phase("checks_and_data")
    heartbeats.start_up("rendezvous (init_distributed)")
    with stops_held():  # a stop now is taken at the first step, as at any moment of the start-up
        init_distributed()
    timer.phase("init_distributed")
    plan = resume.share(decided)
    if plan.finished:
        return plan
    heartbeats.start_up("run files and conversion")
    plan = resume.accept(plan, setup.run_dir, setup.run, setup.rank, config)
    timer.phase("run_files_and_conversion")
    return plan


def build_components(setup: RankSetup, plan: ResumePlan, heartbeats: HeartbeatWriter, timer: PhaseTimer,
                     tracking: TrackedRun) -> StartedRank:
    """Step 3: the engine (init_from's weights on a fresh start), the checkpointer (which loads the plan's
    source), metrics (reporting to `tracking`'s sinks), plots, the numerics guard and the trainer."""
    cfg, rank, run_dir = setup.cfg, setup.rank, setup.run_dir
    # Raised by DeepSpeed's ZeRO all-gather on every step with recent torch; nothing for a user to do.
    warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*", category=FutureWarning)
    heartbeats.start_up("engine")
    initial = InitialWeights.read(setup.run.init, cfg.model) if plan.init_from is not None else None
    engine = build_engine(cfg, plan.ds_config, rank, initial)
    if initial is not None and rank == 0:
        write_init_record(run_dir, initial.record())
    timer.phase("engine")
    shape = setup.run.shape  # the engine's: plan.ds_config is one of setup.run's
    state = TrainState()
    train_batches = ReadAhead(setup.train_batches)  # the trainer reads a step ahead; checkpoints the state before it
    # Before the checkpointer, which loads its running state.
    noise = NoiseProbe.for_engine(cfg.logging.noise_every, engine, shape.zero_stage, setup.world_size)
    checkpointer = Checkpointer(CheckpointedRun(run_dir, rank, shape, cfg.model, cfg.schedule.total_steps,
                                                cfg.checkpoint.keep_last,
                                                setup.train_batches.corpus.tokenizer_sha256),
                                engine, state, train_batches, noise if noise.every else None)
    if plan.source is not None:
        heartbeats.start_up("checkpoint load")
        checkpointer.load(plan.source, cfg.seed, plan.universal_folder(run_dir))
        timer.phase("checkpoint_load")
    scale, skipped = loss_scale(engine), int(engine.skipped_steps)  # as loaded (or fresh)
    options = MetricsOptions.of_run_config(cfg)
    metrics = Metrics(run_dir, rank, setup.run.stages, state.step, options, tracking)
    plots = PlotHook(run_dir, cfg.schedule.total_steps, metrics.message) if rank == 0 and cfg.logging.plots else None
    on_stage_end = stage_end_callback(cfg, run_dir, plots)
    metrics.report_start(timer, plan, setup.world_size, scale, skipped, shape.precision, cfg.logging.peak_tflops)
    noise.attach(metrics.message)
    signals = THIS_RANK
    guard = GuardActions.for_engine(cfg, engine, shape, run_dir, metrics, rank, heartbeats)
    trainer = Trainer(cfg, setup.run.stages, train_batches, setup.valid_batches,
                      TrainParts(engine, state, checkpointer, metrics, guard, noise),
                      TrainerHooks(on_stage_end, heartbeats, stop_requested=lambda: signals.requested is not None))
    return StartedRank(trainer, metrics, heartbeats, plots, run_dir, signals)


def run(started: StartedRank) -> int:
    """trainer.run() to the end of the schedule or a stop; the rank's exit code."""
    trainer, metrics, heartbeats, plots = started.trainer, started.metrics, started.heartbeats, started.plots
    started.stop_signals.arm(StopAnnouncer(trainer.cfg.restarts.preemption_grace_seconds, trainer.rank,
                                           lambda text: metrics.message(text, kept=True),
                                           lambda: trainer.state.step + 1, trainer.cfg.schedule.total_steps))
    outcome = trainer.run()
    heartbeats.ended(outcome, trainer.state.step)
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

"""One rank of pretraining: check the input, build the components (data, engine, checkpointer, metrics,
trainer), resume, then run. Started by launcher.train.rank_entry once the process environment is set.
"""
from __future__ import annotations

import os
import time

PROCESS_START = time.time()  # replaced by the entry's own start time (the start-up timing event)

import argparse
import signal
import sys
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

from launcher.config.run_config import load_run_config
from launcher.config.stages import resolve_stages
from launcher.defaults import BAD_INPUT_EXIT_CODE, GUARD_STOP_EXIT_CODE, ORDERLY_STOP_EXIT_CODE
from launcher.errors import UserError, user_errors
from launcher.report.hook import PlotHook
from launcher.run_dir.layout import RunDir
from launcher.config.stage_end_evals import check_eval_specs
from launcher.train import resume, startup
from launcher.train.checkpointer import Checkpointer
from launcher.train.engine import build_engine
from launcher.train.init_weights import InitialWeights
from launcher.run_dir.records import write_init_record
from launcher.train.progress_recorder import ProgressRecorder
from launcher.train.metrics import Metrics
from launcher.train.progress_line import progress_every
from launcher.train.trainer import Trainer, TrainState


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m launcher.train.rank_entry", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="run config YAML")
    parser.add_argument("--run-dir", required=True, help="run directory (created; resumed when it holds checkpoints)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # added by DeepSpeed
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, process_start: float | None = None) -> int:
    """The rank's work once its environment is set (launcher.train.rank_entry.main); `process_start`:
    when the process started (time.time()), for the start-up timing event."""
    args = parse_args(argv)
    try:
        return train(args, process_start)
    except user_errors() as err:
        print(f"pretrain (rank {os.environ.get('RANK', '?')}): error: {err}", file=sys.stderr, flush=True)
        return BAD_INPUT_EXIT_CODE
    finally:
        startup.release_run_dir()  # rank 0's own lock, when it took one (no `roformer pretrain` above it)


@dataclass
class StartedRank:
    """A rank ready for its first (or resumed) step: what `train` runs, and a benchmark drives step by step."""

    trainer: Trainer
    metrics: Metrics
    progress: ProgressRecorder
    plots: PlotHook | None
    """Rank 0's RUN_DIR/plots renderer (None on the other ranks and with `logging.plots: false`)."""
    run_dir: RunDir


def train(args: argparse.Namespace, process_start: float | None = None) -> int:
    """Start the rank (`start`), then trainer.run() to the end of the schedule or a stop."""
    started = start(args, process_start)
    if started is None:
        return 0
    trainer, metrics, progress, plots = started.trainer, started.metrics, started.progress, started.plots
    install_stop_handlers(trainer, metrics)
    outcome = trainer.run()
    progress.ended(outcome, trainer.state.step)
    metrics.event(outcome, step=trainer.state.step)
    if plots is not None:  # RUN_DIR/plots complete when a finished run returns; a stop does not wait
        plots.run_end(trainer.state.step, wait=outcome == "finished")
    if outcome == "guard_stopped":  # its own line, last: step, figure, median, threshold, resume point
        metrics.message(trainer.guard.stop_message)
    else:
        metrics.message(f"{outcome} at step {trainer.state.step}; checkpoints in {started.run_dir.checkpoints}")
    metrics.close()
    return {"finished": 0, "guard_stopped": GUARD_STOP_EXIT_CODE}.get(outcome, ORDERLY_STOP_EXIT_CODE)


def start(args: argparse.Namespace, process_start: float | None = None) -> StartedRank | None:
    """Check the input, build the components (data, engine, checkpointer, metrics) and resume; None when
    the run is already at the end of its schedule."""
    # Raised by DeepSpeed's ZeRO all-gather on every step with recent torch; nothing for a user to do.
    warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*", category=FutureWarning)
    timer = startup.PhaseTimer(process_start or time.time())
    cfg = load_run_config(args.config, args.overrides)
    check_eval_specs(cfg.logging.stage_end_evals, where=f"{cfg.source}: logging.stage_end_evals")
    rank, world_size = rank_and_world_size()
    stages = resolve_stages(cfg, world_size)
    run_dir = startup.prepare_run_dir(Path(args.run_dir))
    if rank == 0:  # one job per run directory: refused before anything is written (launcher/run_dir/lock.py)
        startup.claim_run_dir(run_dir)
    progress = ProgressRecorder(run_dir, rank, cfg.watchdog)  # heartbeats for the hang watchdog (rank guard)
    progress.start_up("checks and data")
    batches, valid_batches = startup.open_batches(cfg, stages, rank, world_size)
    decision = resume.decide(run_dir, cfg, stages, world_size, batches) if rank == 0 else None  # writes nothing
    timer.phase("checks_and_data")

    progress.start_up("rendezvous (init_distributed)")
    startup.init_distributed()
    timer.phase("init_distributed")
    progress.start_up("run files and conversion")
    decision = resume.share(decision)
    point, universal, ds_config = decision.point, decision.universal, decision.ds_config
    if decision.finished:
        if rank == 0:
            print(f"{run_dir.root}: already trained to the end of the schedule (step {point.sidecar.step}); "
                  "nothing to do", file=sys.stderr)
        return None
    notes = resume.accept(decision, run_dir, cfg, stages, world_size, rank)
    timer.phase("run_files_and_conversion")
    progress.start_up("engine")
    # init_from: DIR's weights on a fresh start only; a resumed run continues from its checkpoint.
    initial = InitialWeights.read(cfg.init_from, cfg.model) if cfg.init_from and point is None else None
    engine = build_engine(cfg, ds_config, rank, initial)
    if initial is not None and rank == 0:
        write_init_record(run_dir, initial.record())
    timer.phase("engine")
    state = TrainState()
    checkpointer = Checkpointer(run_dir, engine, state, batches, model_config=cfg.model, rank=rank,
                                world_size=world_size, keep_last=cfg.checkpoint.keep_last,
                                total_steps=cfg.schedule.total_steps, tokenizer_sha256=batches.corpus.tokenizer_sha256)
    if point is not None:
        progress.start_up("checkpoint load")
        checkpointer.load(point, universal, cfg.seed)
        timer.phase("checkpoint_load")
    metrics = Metrics(run_dir, rank, stages, cfg.schedule.total_steps, state.step, cfg.logging.log_every,
                      cfg.logging.progress_bar, progress_every(cfg.logging.progress_every, cfg.schedule.total_steps))
    startup.report_start(metrics, timer, point, engine, world_size, universal)
    startup.report_peak(metrics, cfg, engine)
    for note in notes:  # damaged checkpoints set aside, a new config version (printed already)
        metrics.event("resume_note", step=state.step, message=note)
    plots = PlotHook(run_dir, cfg.schedule.total_steps, metrics.message) if rank == 0 and cfg.logging.plots else None
    trainer = Trainer(cfg, stages, engine, batches, valid_batches, state, checkpointer, metrics,
                      on_stage_end=startup.stage_end_callback(cfg, run_dir, plots), progress=progress)
    return StartedRank(trainer, metrics, progress, plots, run_dir)


def rank_and_world_size() -> tuple[int, int]:
    try:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        raise UserError("RANK / WORLD_SIZE are not set: start this through `roformer pretrain` "
                        "(DeepSpeed's launcher), not directly") from None


SAME_STOP_SECONDS = 5.0
"""A second stop signal this soon after the first is the same stop delivered twice (a scheduler preempting
the job signals every process of it, and DeepSpeed's per-node launcher passes its own on to the ranks),
not a second request: it is ignored, so the checkpoint at the current step is still written."""


def install_stop_handlers(trainer, metrics) -> None:
    """SIGTERM / SIGINT: finish the current step, checkpoint, exit (all ranks agree via the step's all-reduce),
    within restarts.preemption_grace_seconds; after that the rank exits without the checkpoint, saying so."""
    grace = trainer.cfg.restarts.preemption_grace_seconds
    first_at: list[float] = []

    def out_of_grace():
        print(f"pretrain (rank {trainer.rank}): no checkpoint within the preemption grace time of {grace:g} s "
              f"(restarts.preemption_grace_seconds): exiting without it; the newest complete checkpoint stays the "
              f"resume point", file=sys.stderr, flush=True)
        os._exit(1)

    def request_stop(signum, _frame):
        if not trainer.stop_signalled:
            trainer.stop_signalled = True
            first_at.append(time.monotonic())
            metrics.message(f"stop requested ({signal.Signals(signum).name}): finishing step {trainer.state.step + 1}, "
                            f"then a checkpoint (within {grace:g} s)")
            timer = threading.Timer(grace, out_of_grace)
            timer.daemon = True  # a rank that finished its checkpoint exits without waiting for it
            timer.start()
        elif time.monotonic() - first_at[0] < SAME_STOP_SECONDS:
            pass  # the same stop, fanned out by the process tree
        else:  # a second signal: stop now
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)

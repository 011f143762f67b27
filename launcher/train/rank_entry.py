"""Per-rank entry of pretraining, started by DeepSpeed's launcher (`roformer pretrain` builds the command):

    python -m launcher.train.rank_entry --config CFG --run-dir RUN_DIR [--set section.key=value ...]

Everything that can be wrong with the input is checked before the engine exists and before anything
in RUN_DIR is written: the run config, the stages for this world size, the run directory, the data,
and (rank 0, launcher/train/resume.py) the checkpoint to resume: its files against the checksums of
its save, its model, tokenizer, data position, precision and ZeRO stage. Then the run resumes from
the newest intact checkpoint of RUN_DIR (through a universal checkpoint when the world size
changed; damaged newer ones are moved aside and named) or starts fresh, and trains to the end.
Exit codes: 0 finished, 2 bad input (one line on stderr), 143 stopped by SIGTERM/SIGINT after
saving a checkpoint (re-run the same command to resume).
"""
from __future__ import annotations

import os
import time

PROCESS_START = time.time()  # for the start-up timing event


def _default_omp_threads() -> None:
    # Must run before torch is imported. Ranks of one node share its cores; without this every
    # rank would start one thread per core and the node would be oversubscribed.
    if "OMP_NUM_THREADS" not in os.environ:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        os.environ["OMP_NUM_THREADS"] = str(max(1, cores // max(1, int(os.environ.get("LOCAL_SIZE", "1")))))


_default_omp_threads()


def _own_ops_cache() -> None:
    # Before DeepSpeed is imported: this Python environment's op cache, however the rank was started
    # (a shared one makes two environments rebuild each other's op on every start: launcher/ops_cache.py).
    from launcher.ops_cache import ENV_VAR, extensions_dir

    os.environ[ENV_VAR] = str(extensions_dir())


_own_ops_cache()

import argparse  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

from launcher.config.run_config import load_run_config  # noqa: E402
from launcher.config.stages import resolve_stages  # noqa: E402
from launcher.defaults import BAD_INPUT_EXIT_CODE, ORDERLY_STOP_EXIT_CODE  # noqa: E402
from launcher.errors import UserError, user_errors  # noqa: E402
from launcher.report.hook import PlotHook  # noqa: E402
from launcher.run_dir import RunDir  # noqa: E402
from launcher.stage_end_jobs import check_eval_specs  # noqa: E402
from launcher.train import resume, startup  # noqa: E402
from launcher.train.checkpointer import Checkpointer  # noqa: E402
from launcher.train.engine import build_engine  # noqa: E402
from launcher.train.heartbeat import ProgressRecorder  # noqa: E402
from launcher.train.metrics import Metrics  # noqa: E402
from launcher.train.progress import progress_every  # noqa: E402
from launcher.train.trainer import Trainer, TrainState  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m launcher.train.rank_entry", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="run config YAML")
    parser.add_argument("--run-dir", required=True, help="run directory (created; resumed when it holds checkpoints)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # added by DeepSpeed
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return train(args)
    except user_errors() as err:
        print(f"pretrain (rank {os.environ.get('RANK', '?')}): error: {err}", file=sys.stderr, flush=True)
        return BAD_INPUT_EXIT_CODE


@dataclass
class StartedRank:
    """A rank ready for its first (or resumed) step: what `train` runs, and a benchmark drives step by step."""

    trainer: Trainer
    metrics: Metrics
    progress: ProgressRecorder
    plots: PlotHook | None
    """Rank 0's RUN_DIR/plots renderer (None on the other ranks)."""
    run_dir: RunDir


def train(args: argparse.Namespace) -> int:
    """Start the rank (`start`), then trainer.run() to the end of the schedule or a stop."""
    started = start(args)
    if started is None:
        return 0
    trainer, metrics, progress, plots = started.trainer, started.metrics, started.progress, started.plots
    install_stop_handlers(trainer, metrics)
    outcome = trainer.run()
    progress.ended(outcome, trainer.state.step)
    metrics.event(outcome, step=trainer.state.step)
    if plots is not None:  # RUN_DIR/plots complete when a finished run returns; a stop does not wait
        plots.run_end(trainer.state.step, wait=outcome == "finished")
    metrics.message(f"{outcome} at step {trainer.state.step}; checkpoints in {started.run_dir.checkpoints}")
    metrics.close()
    return 0 if outcome == "finished" else ORDERLY_STOP_EXIT_CODE


def start(args: argparse.Namespace) -> StartedRank | None:
    """Check the input, build the components (data, engine, checkpointer, metrics) and resume; None when
    the run is already at the end of its schedule."""
    # Raised by DeepSpeed's ZeRO all-gather on every step with recent torch; nothing for a user to do.
    warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*", category=FutureWarning)
    timer = startup.PhaseTimer(PROCESS_START)
    cfg = load_run_config(args.config, args.overrides)
    check_eval_specs(cfg.logging.stage_end_evals, where=f"{cfg.source}: logging.stage_end_evals")
    rank, world_size = rank_and_world_size()
    stages = resolve_stages(cfg, world_size)
    run_dir = startup.prepare_run_dir(Path(args.run_dir))
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
    engine = build_engine(cfg, ds_config, rank)
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
    plots = PlotHook(run_dir, cfg.schedule.total_steps, metrics.message) if rank == 0 else None
    trainer = Trainer(cfg, stages, engine, batches, valid_batches, state, checkpointer, metrics,
                      on_stage_end=startup.stage_end_callback(cfg, run_dir, plots), progress=progress)
    return StartedRank(trainer, metrics, progress, plots, run_dir)


def rank_and_world_size() -> tuple[int, int]:
    try:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        raise UserError("RANK / WORLD_SIZE are not set: start this through `roformer pretrain` "
                        "(DeepSpeed's launcher), not directly") from None


def install_stop_handlers(trainer, metrics) -> None:
    """SIGTERM / SIGINT: finish the current step, checkpoint, exit (all ranks agree via the step's all-reduce)."""

    def request_stop(signum, _frame):
        if not trainer.stop_signalled:
            trainer.stop_signalled = True
            metrics.message(f"stop requested ({signal.Signals(signum).name}): finishing step {trainer.state.step + 1}, "
                            f"then a checkpoint")
        else:  # a second signal: stop now
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)


if __name__ == "__main__":
    sys.exit(main())

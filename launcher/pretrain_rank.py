"""Per-rank entry of pretraining, started by DeepSpeed's launcher (`roformer pretrain` builds the command):

    python -m launcher.pretrain_rank --config CFG --run-dir RUN_DIR [--set section.key=value ...]

Everything that can be wrong with the input is checked before the engine exists: the run config,
the stages for this world size, the run directory, a checkpoint of another model, the data. Then
the run resumes from the newest complete checkpoint of RUN_DIR (through a universal checkpoint
when the world size changed) or starts fresh, and trains to the end of the schedule.
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

import argparse  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from launcher import checkpoint as ckpt  # noqa: E402
from launcher.batching import resolve_ds_config, resolve_stages, stage_for_step  # noqa: E402
from launcher.config import RunConfig, dump_run_config, load_run_config  # noqa: E402
from launcher.errors import UserError  # noqa: E402

STOPPED_EXIT_CODE = 143


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m launcher.pretrain_rank", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="run config YAML")
    parser.add_argument("--run-dir", required=True, help="run directory (created; resumed when it holds checkpoints)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)  # added by DeepSpeed
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from data_pipeline.errors import DataError
    from roformer.config import ConfigError

    try:
        return train(args)
    except (UserError, DataError, ConfigError) as err:
        print(f"pretrain (rank {os.environ.get('RANK', '?')}): error: {err}", file=sys.stderr, flush=True)
        return 2


def train(args: argparse.Namespace) -> int:
    import warnings

    # Raised by DeepSpeed's ZeRO all-gather on every step with recent torch; nothing for a user to do.
    warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*", category=FutureWarning)
    phases = {"imports": time.time() - PROCESS_START}
    mark = time.perf_counter()

    def phase(name: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        phases[name] = now - mark
        mark = now

    cfg = load_run_config(args.config, args.overrides)
    rank, world_size = _rank_and_world_size()
    stages = resolve_stages(cfg, world_size)
    model_config = cfg.model_config()
    run_dir = prepare_run_dir(Path(args.run_dir))
    ckpt.check_foreign_checkpoints(run_dir)
    point = ckpt.find_resume_point(run_dir)
    if point is not None:
        ckpt.check_compatible(point, model_config)
        if point.sidecar["step"] >= stages[-1].end_step:
            print(f"{run_dir}: already trained to the end of the schedule (step {point.sidecar['step']}); "
                  f"nothing to do", file=sys.stderr)
            return 0
    train_corpus, valid_corpus = open_data(cfg, model_config)
    batches = make_batches(cfg, train_corpus, rank, world_size)
    for stage in stages:  # a corpus too small for a stage's global batch fails now, not mid-run
        batches.check_min_size(stage.max_seq_len, stage.global_batch_size)

    phase("checks_and_data")
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    deepspeed.init_distributed(dist_backend=get_accelerator().communication_backend_name())
    import deepspeed.comm as dist

    phase("init_distributed")

    start_stage, _ = stage_for_step(stages, point.sidecar["step"] if point else 0)
    universal = point is not None and ckpt.needs_universal(point, world_size)
    ds_config = resolve_ds_config(cfg, start_stage, world_size, load_universal=universal)
    if rank == 0:
        write_run_files(run_dir, cfg, ds_config, stages, world_size)
        if universal:
            ckpt.convert_to_universal(point, run_dir)
    dist.barrier()
    phase("run_files_and_conversion")

    engine = build_engine(cfg, model_config, ds_config, rank)
    phase("engine")
    from launcher.trainer import Trainer, TrainState

    state, resume_seconds = TrainState(), None
    valid_batches = make_batches(cfg, valid_corpus, rank, world_size)
    if point is not None:
        start = time.perf_counter()
        state = resume(engine, point, run_dir, universal, batches, rank, cfg.seed)
        resume_seconds = time.perf_counter() - start
        phase("checkpoint_load")

    from launcher.metrics import Metrics

    metrics = Metrics(run_dir, rank, stages, state.step, cfg.logging.log_every, cfg.logging.progress_bar)
    if point is not None:
        from launcher.trainer import loss_scale

        metrics.event("resume", step=state.step, tag=point.tag, from_world_size=point.sidecar["world_size"],
                      world_size=world_size, universal=universal, seconds=resume_seconds,
                      loss_scale=loss_scale(engine), skipped_steps=int(engine.skipped_steps))
        metrics.message(f"resumed from {point.tag} (step {state.step}) in {resume_seconds:.2f} s"
                        f"{' via a universal checkpoint' if universal else ''}")
    metrics.event("startup", step=state.step, seconds=time.time() - PROCESS_START,
                  phases={k: round(v, 3) for k, v in phases.items()})
    trainer = Trainer(engine, batches, valid_batches, stages, cfg, run_dir, metrics, state, model_config.to_dict())
    install_stop_handlers(trainer, metrics)
    outcome = trainer.run()
    metrics.event(outcome, step=state.step)
    metrics.message(f"{outcome} at step {state.step}; checkpoints in {ckpt.checkpoints_dir(run_dir)}")
    metrics.close()
    return 0 if outcome == "finished" else STOPPED_EXIT_CODE


def _rank_and_world_size() -> tuple[int, int]:
    try:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        raise UserError("RANK / WORLD_SIZE are not set: start this through `roformer pretrain` "
                        "(DeepSpeed's launcher), not directly") from None


def prepare_run_dir(run_dir: Path) -> Path:
    """Create RUN_DIR (its parent must exist) and check it is a writable directory."""
    run_dir = run_dir.expanduser().resolve()
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"--run-dir {run_dir}: exists and is not a directory")
    if not run_dir.parent.is_dir():
        raise UserError(f"--run-dir {run_dir}: parent directory {run_dir.parent} does not exist")
    try:
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise UserError(f"--run-dir {run_dir}: not writable ({err.strerror})") from None
    return run_dir


def open_data(cfg: RunConfig, model_config):
    from data_pipeline import open_corpus

    train = open_corpus(Path(cfg.data.data_dir), split="train", verify=cfg.data.verify)
    valid = open_corpus(Path(cfg.data.data_dir), split="valid", verify=cfg.data.verify)
    if train.vocab_size > model_config.vocab_size:
        raise UserError(f"{cfg.source}: model.vocab_size {model_config.vocab_size} is smaller than the "
                        f"tokenizer's vocabulary {train.vocab_size} in {cfg.data.data_dir}")
    return train, valid


def make_batches(cfg: RunConfig, corpus, rank: int, world_size: int):
    from data_pipeline import MaskingConfig, PretrainBatches

    return PretrainBatches(corpus, rank=rank, world_size=world_size, seed=cfg.data.seed,
                           masking=MaskingConfig(**cfg.data.masking))


def write_run_files(run_dir: Path, cfg: RunConfig, ds_config: dict, stages, world_size: int) -> None:
    dump_run_config(cfg, run_dir / "config.yaml")
    ckpt.atomic_write_text(run_dir / "ds_config.resolved.json", json.dumps(ds_config, indent=2) + "\n")
    ckpt.atomic_write_text(run_dir / "stages.json", json.dumps(
        {"world_size": world_size, "stages": [s.to_dict() for s in stages]}, indent=2) + "\n")


def build_engine(cfg: RunConfig, model_config, ds_config: dict, rank: int):
    import deepspeed
    from roformer import RoFormerForMaskedLM

    ckpt.seed_everything(cfg.seed)  # the same initial weights on every rank
    model = RoFormerForMaskedLM(model_config)
    ckpt.seed_everything(cfg.seed * 1009 + rank)  # independent dropout per rank
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]  # biases and LayerNorm: no weight decay
    groups = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=ds_config)
    return engine


def resume(engine, point: ckpt.ResumePoint, run_dir: Path, universal: bool, batches, rank: int, seed: int):
    from launcher.trainer import TrainState

    load_dir = ckpt.universal_dir(run_dir) if universal else ckpt.checkpoints_dir(run_dir)
    path, client_state = engine.load_checkpoint(str(load_dir), tag=point.tag)
    if path is None:
        raise RuntimeError(f"DeepSpeed could not load {load_dir / point.tag}")
    sidecar = point.sidecar
    saved = (client_state or {}).get("roformer_ds", {})
    if saved.get("step") != sidecar["step"]:
        raise RuntimeError(f"{point.directory}: sidecar step {sidecar['step']} does not match the DeepSpeed "
                           f"checkpoint's client state step {saved.get('step')}")
    batches.load_state_dict(sidecar["data_state"])
    if universal or not ckpt.load_rng(point.directory, rank):
        ckpt.seed_everything(seed * 1009 + rank + 7919 * sidecar["step"])  # other world size: fresh streams
    return TrainState(step=sidecar["step"], consumed_samples=sidecar["consumed_samples"],
                      consumed_tokens=sidecar["consumed_tokens"], last_validation=sidecar.get("last_validation", {}))


def install_stop_handlers(trainer, metrics) -> None:
    """SIGTERM / SIGINT: finish the current step, checkpoint, exit (all ranks agree via the step's all-reduce)."""

    def request_stop(signum, _frame):
        if not trainer.stop_signalled:
            trainer.stop_signalled = True
            metrics.message(f"{signal.Signals(signum).name}: stopping after this step with a checkpoint")
        else:  # a second signal: stop now
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)


if __name__ == "__main__":
    sys.exit(main())

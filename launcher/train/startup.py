"""Start-up of one rank, in the order the rank entry runs it: the run directory, the data, the resume
decision (launcher/train/resume.py: rank 0 checks, then shares it; the run's record files are written
only once it is accepted), the distributed group, and the start-up report."""
from __future__ import annotations

import atexit
import os
import sys
import time
from pathlib import Path

import deepspeed
from deepspeed.accelerator import get_accelerator

from launcher.config.preflight_checks import check_run
from launcher.config.run_config import RunConfig
from launcher.config.stages import ResolvedStage
from launcher.errors import UserError
from launcher.report.hook import PlotHook
from launcher.run_dir.layout import RunDir
from launcher.run_dir.lock import LOCK_ID_ENV, acquire
from launcher.train.stage_end_jobs import start_stage_end_job
from launcher.run_dir.checkpoint_catalogue import CheckpointEntry
from launcher.train.engine import loss_scale, precision
from launcher.train.metrics import Metrics
from launcher.mfu import resolve_peak
from launcher.train.trainer import StageEndCallback


def resident_bytes() -> int | None:
    """This process's resident set size now (Linux /proc/self/statm; None where there is none)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class PhaseTimer:
    """Seconds spent in each start-up phase, and the resident memory at each phase's end (the `startup`
    event of metrics.jsonl): the memory after `run_files_and_conversion` is the process before the model
    exists (interpreter, torch, DeepSpeed, data readers, process group), which `roformer plan`'s
    estimate of the model-dependent memory does not include."""

    def __init__(self, process_start: float):
        self.process_start = process_start
        self.phases = {"imports": time.time() - process_start}
        self.resident = {"imports": resident_bytes()}
        self.mark = time.perf_counter()

    def phase(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = now - self.mark
        self.resident[name] = resident_bytes()
        self.mark = now


def prepare_run_dir(path: Path) -> RunDir:
    """Create RUN_DIR (its parent must exist) and check it is a writable directory. An existing one
    is only checked (access(2), which also sees a read-only mount): a refused resume must leave it
    exactly as it was, down to its mtime."""
    root = path.expanduser().resolve()
    if root.exists() and not root.is_dir():
        raise UserError(f"--run-dir {root}: exists and is not a directory")
    if not root.parent.is_dir():
        raise UserError(f"--run-dir {root}: parent directory {root.parent} does not exist")
    run_dir = RunDir(root)
    if root.is_dir():
        if not os.access(root, os.W_OK | os.X_OK):
            raise UserError(f"--run-dir {root}: not writable")
        return run_dir
    try:
        run_dir.checkpoints.mkdir(parents=True, exist_ok=True)
        probe = root / f".write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise UserError(f"--run-dir {root}: not writable ({err.strerror})") from None
    return run_dir


_held_locks: list = []  # rank 0's own run-directory lock (at most one), released by release_run_dir


def claim_run_dir(run_dir: RunDir) -> None:
    """Rank 0: the run directory's lock (launcher/run_dir/lock.py). Under `roformer pretrain` the
    launcher holds it and passed its id in LOCK_ID_ENV: rank 0 finds it there and writes nothing (the
    launcher keeps it across restarts). A job started by plain mpirun / srun has no launcher: rank 0
    takes the lock for its life. Either way another live job's lock is refused (RunDirInUse, one line
    naming it), before this rank writes anything."""
    lock = acquire(run_dir.root, command="rank 0", lock_id=os.environ.get(LOCK_ID_ENV) or None,
                   note=lambda text: print(f"pretrain (rank 0): note: {text}", file=sys.stderr, flush=True))
    if lock.owned:
        _held_locks.append(lock)
        atexit.register(lock.release)  # a benchmark drives `start` without `main`; release is idempotent


def release_run_dir() -> None:
    while _held_locks:
        _held_locks.pop().release()


def open_batches(cfg: RunConfig, stages: list[ResolvedStage], rank: int, world_size: int):
    """This rank's training and validation batches, after every check `roformer plan` and `--dry-run`
    run too (launcher/config/preflight_checks.py): the DeepSpeed config through DeepSpeed's own
    parser and against this accelerator, the data and its tokenizer against model.vocab_size, and
    each stage against the corpus size.

    Shard content is verified once, by rank 0 (and it re-hashes only shards changed since they were
    written: data_pipeline/shards.py); the others check structure and sizes. A corrupt shard stops
    rank 0 before the process group starts, so the job ends there."""
    checked = check_run(cfg, stages, world_size, rank=rank, verify_data=cfg.data.verify and rank == 0)
    return checked.train, checked.valid


# DeepSpeed's CPU shared-memory all-reduce (ops/csrc/cpu/comm/shm.cpp, used when every rank is on one
# node) creates /dev/shm/<prefix>_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank> (~66 MB each) and never
# removes it: /dev/shm is RAM, and every run used to leave world-size such files behind.
SHM_ALLREDUCE_PREFIX = "deepspeed_allreduce_buffer"


def init_distributed() -> None:
    deepspeed.init_distributed(dist_backend=get_accelerator().communication_backend_name())
    _unlink_shm_allreduce_buffer()


def shm_allreduce_buffer(rank: int) -> Path:
    """Where DeepSpeed's CPU all-reduce keeps rank `rank`'s buffer of this job."""
    name = f"{SHM_ALLREDUCE_PREFIX}_{os.getuid()}_{os.environ.get('MASTER_ADDR', '')}_{os.environ.get('MASTER_PORT', '')}"
    return Path("/dev/shm") / f"{name}_{rank}"


def _unlink_shm_allreduce_buffer() -> None:
    """Remove this rank's buffer NAME once every rank has mapped every peer's buffer (each rank's
    initialisation opens all peers before it returns; the barrier waits for all of them). The
    mappings stay valid until the processes exit, and the memory is freed with the last one, even
    when a rank is killed."""
    deepspeed.comm.barrier()  # on every rank: whether a buffer exists is not a collective decision
    shm_allreduce_buffer(deepspeed.comm.get_rank()).unlink(missing_ok=True)


def report_start(metrics: Metrics, timer: PhaseTimer, point: CheckpointEntry | None, engine, world_size: int,
                 universal: bool) -> None:
    step = point.sidecar.step if point else 0
    if point is not None:
        seconds = timer.phases["checkpoint_load"]
        metrics.event("resume", step=step, tag=point.tag, from_world_size=point.sidecar.world_size,
                      world_size=world_size, universal=universal, seconds=seconds,
                      loss_scale=loss_scale(engine), skipped_steps=int(engine.skipped_steps))
        metrics.message(f"resumed from {point.tag} (step {step}) in {seconds:.2f} s"
                        f"{' via a universal checkpoint' if universal else ''}")
    metrics.event("startup", step=step, seconds=time.time() - timer.process_start,
                  phases={k: round(v, 3) for k, v in timer.phases.items()}, resident_bytes=timer.resident)


def report_peak(metrics: Metrics, cfg: RunConfig, engine) -> None:
    """Rank 0: the peak MFU is measured against (a timed matmul on CPU), recorded as an event."""
    if not metrics.active:
        return
    start = time.perf_counter()
    peak = resolve_peak(cfg.logging.peak_tflops, precision(engine))
    metrics.set_peak(peak)
    if peak.source == "measured":
        metrics.message(f"peak for MFU: {peak.tflops:.3f} TFLOP/s fp32 (matmul measured in "
                        f"{time.perf_counter() - start:.1f} s)")
    elif peak.tflops is None:
        metrics.message(f"peak for MFU: unknown for {peak.device!r} ({peak.precision}); set logging.peak_tflops "
                        "to report MFU")


def stage_end_callback(cfg: RunConfig, run_dir: RunDir, plots: PlotHook | None = None) -> StageEndCallback | None:
    """On each stage-end checkpoint (rank 0): refresh RUN_DIR/plots and start the configured
    stage-end evals, each a detached process."""
    specs = list(cfg.logging.stage_end_evals)
    if not specs and plots is None:
        return None

    def on_stage_end(tag: str, stage: ResolvedStage) -> None:
        if plots is not None:
            plots.stage_end(stage.end_step)
        if specs:
            start_stage_end_job(run_dir, tag, stage.name, specs)

    return on_stage_end

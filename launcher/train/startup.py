"""Pieces of a rank's start-up (launcher/train/rank.py runs it in three steps): the phase timer, the
distributed group, the start-up report and the stage-end callback."""
from __future__ import annotations

import os
import time
from pathlib import Path

import deepspeed
from deepspeed.accelerator import get_accelerator

from launcher.checkpoint.checkpointer import loss_scale
from launcher.checkpoint.resume import ResumePlan
from launcher.config.run_config import RunConfig
from launcher.config.stages import ResolvedStage
from launcher.report.hook import PlotHook
from launcher.run_dir.layout import RunDir
from launcher.train.stage_end_jobs import start_stage_end_job
from launcher.train.engine import precision
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


def report_start(metrics: Metrics, timer: PhaseTimer, plan: ResumePlan, engine, cfg: RunConfig, world_size: int) -> None:
    """The start-up's events: `resume` (and its console line) on a start from a checkpoint, `startup` (phases,
    memory), one `resume_note` per line the resume said, then rank 0's peak for MFU (a timed matmul on CPU)."""
    scale, skipped, trained_in = loss_scale(engine), int(engine.skipped_steps), precision(engine)
    if plan.source is not None:
        seconds = timer.phases["checkpoint_load"]
        metrics.event("resume", step=plan.step, tag=plan.source.tag, from_world_size=plan.source.sidecar.world_size,
                      world_size=world_size, universal=plan.universal, seconds=seconds, loss_scale=scale,
                      skipped_steps=skipped)
        metrics.message(f"resumed from {plan.source.tag} (step {plan.step}) in {seconds:.2f} s"
                        f"{' via a universal checkpoint' if plan.universal else ''}")
    metrics.event("startup", step=plan.step, seconds=time.time() - timer.process_start,
                  phases={k: round(v, 3) for k, v in timer.phases.items()}, resident_bytes=timer.resident)
    for note in plan.notes:  # the route, damaged checkpoints set aside, a new config version (printed already)
        metrics.event("resume_note", step=plan.step, message=note)
    if not metrics.active:
        return
    measured_from = time.perf_counter()
    peak = resolve_peak(cfg.logging.peak_tflops, trained_in)
    metrics.set_peak(peak)
    if peak.source == "measured":
        metrics.message(f"peak for MFU: {peak.tflops:.3f} TFLOP/s fp32 (matmul measured in "
                        f"{time.perf_counter() - measured_from:.1f} s)")
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

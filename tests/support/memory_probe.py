"""Memory of the ranks of a real `roformer pretrain` run against `roformer plan`'s estimate (used by
tests/multirank/test_memory_estimate.py and bench/bench_memory.py).

Measured: the kernel's high-water mark of each rank's resident set (VmHWM in /proc/<pid>/status),
read while the rank's heartbeat (RUN_DIR/heartbeats/rank<r>.json: its pid and phase) says 'train', so
the stage-end validation and checkpoint are not in it; and rank 0's resident memory before the model
exists (the `startup` event's resident_bytes after run_files_and_conversion: interpreter, torch,
DeepSpeed, data readers, process group). The model-dependent part, peak minus that, is what the
estimate (launcher/pricing/estimate.py, without its fixed runtime allowance) predicts. Linux only.
"""
from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from launcher.run_dir.heartbeat_file import Heartbeat, read_record
from launcher.run_dir.layout import RunDir

BEFORE_MODEL_PHASE = "run_files_and_conversion"


@dataclass
class MeasuredRun:
    peak_bytes: dict[int, int]
    """Rank -> its resident high-water mark while training."""
    before_model_bytes: int
    """Rank 0's resident memory before the model existed."""
    steps: int
    """Train records in metrics.jsonl when the run ended."""

    def model_dependent_bytes(self, rank: int) -> int:
        return self.peak_bytes[rank] - self.before_model_bytes


def high_water_mark(pid: int) -> int | None:
    """VmHWM of a process in bytes (None once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def watch(proc: subprocess.Popen, run_dir: Path, ranks: int, timeout: float, poll_seconds: float = 0.05
          ) -> MeasuredRun:
    """Poll the ranks of the run `proc` started until it exits; its exit code must be 0."""
    from launcher.train.metrics import read_metrics

    run = RunDir(run_dir)
    peaks: dict[int, int] = {}
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"run {run_dir} still running after {timeout:.0f} s")
        for rank in range(ranks):
            beat = read_record(run.heartbeat(rank), Heartbeat)
            if beat is not None and beat.phase == "train":
                mark = high_water_mark(beat.pid)
                if mark is not None:
                    peaks[rank] = max(mark, peaks.get(rank, 0))
        time.sleep(poll_seconds)
    if proc.returncode != 0:
        raise RuntimeError(f"run {run_dir} failed with exit code {proc.returncode}")
    if sorted(peaks) != list(range(ranks)):
        raise RuntimeError(f"run {run_dir}: no training phase seen for ranks {set(range(ranks)) - set(peaks)}")
    startup = [r for r in read_metrics(run_dir, "event") if r["event"] == "startup"][-1]
    return MeasuredRun(peaks, startup["resident_bytes"][BEFORE_MODEL_PHASE], len(read_metrics(run_dir, "train")))


def estimated_model_bytes(config: Path, world_size: int) -> dict:
    """The estimate of the run's first stage per rank, as `roformer plan` computes it: the model-dependent
    part (model states, activations, buckets) and the fixed allowance on top of it."""
    from launcher.config.deepspeed_json import DeepSpeedJson
    from launcher.pricing.estimate import estimate_memory, setup_from_configs
    from launcher.config.run_config import load_run_config
    from launcher.config.stages import resolve_stages

    cfg = load_run_config(config)
    stage = resolve_stages(cfg, world_size)[0]
    setup = setup_from_configs(cfg.model, DeepSpeedJson.of(cfg), world_size, cfg.schedule.activation_checkpointing,
                               cpu_ranks=True)
    memory = estimate_memory(setup, stage.micro_batch_size, stage.max_seq_len)
    return {"model_states": memory.model_states, "activations": memory.active_activations,
            "buckets": memory.buckets, "optimizer_step": memory.optimizer_step,
            "model_dependent": memory.model_dependent, "runtime_allowance": memory.runtime}

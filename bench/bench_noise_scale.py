"""What `logging.noise_every` costs: the real trainer's step with and without the gradient-noise measurement.

    DS_ACCELERATOR=cpu .venv/bin/python bench/bench_noise_scale.py [--rounds 20] [--batch-size 16 --seq-len 128]

Rank 0 of a real 1-rank run in this process (bench_overhead.py's start-up: run-config and data checks, the
data pipeline, the DeepSpeed engine of ds_configs/cpu_fp32_zero2.json, metrics.jsonl), one stage with one
micro-batch per step: the worst case, where the measurement pass (a forward and backward of the step's micro-batch,
as two halves at world size 1; launcher/train/noise_probe.py) is as big as the step's own. Steps alternate
measured / not measured (the order flipped every round), each timed in CPU seconds of this process
(time.process_time: less moved by other processes than wall time on a shared machine) and wall seconds; the
extra per measurement is the median of the paired differences. The cost of noise_every N is extra / (N x step),
and the smallest N at or under 2% is reported (the default, launcher/config/sections.py, must be at least it).
Results: bench/results/noise_scale.json (with the load average before and after).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
RESULTS = REPO / "bench" / "results" / "noise_scale.json"
BUDGET = 0.02
"""The share of training time the measurement may cost (issue 61)."""


def timed_step(trainer, stage) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one real trainer step (its train record included)."""
    cpu, wall = time.process_time(), time.perf_counter()
    trainer.step(stage)
    return time.process_time() - cpu, time.perf_counter() - wall


def run(args, root: Path) -> dict:
    import torch

    from bench_overhead import MODEL, prepare_corpus, start_trainer, write_run_config
    from launcher.config.sections import LoggingSection
    from launcher.train.metrics import read_metrics

    torch.set_num_threads(args.threads)
    data_dir = args.data_dir or root / "data"
    if args.data_dir is None:
        prepare_corpus(data_dir, MODEL["vocab_size"])
    steps = 2 * args.rounds + args.warmup
    config = write_run_config(root, data_dir, args.batch_size, args.seq_len, steps)
    started, stage = start_trainer(config, root / "run")
    trainer, probe = started.trainer, started.trainer.noise
    for _ in range(args.warmup):
        probe.every = 1
        trainer.step(stage)
    cpu = {True: [], False: []}
    wall = {True: [], False: []}
    for round_ in range(args.rounds):
        for measured in ((True, False) if round_ % 2 == 0 else (False, True)):
            probe.every = 1 if measured else 0  # 1: due at every step
            seconds_cpu, seconds_wall = timed_step(trainer, stage)
            cpu[measured].append(seconds_cpu)
            wall[measured].append(seconds_wall)
    started.metrics.close()
    records = read_metrics(root / "run")
    estimates = [r["grad_noise_scale"] for r in records if "grad_noise_scale" in r]
    extra_cpu = statistics.median(a - b for a, b in zip(cpu[True], cpu[False]))
    extra_wall = statistics.median(a - b for a, b in zip(wall[True], wall[False]))
    step_cpu, step_wall = statistics.median(cpu[False]), statistics.median(wall[False])
    default = LoggingSection().noise_every
    return {
        "shape": {"model": MODEL, "batch_size": args.batch_size, "seq_len": args.seq_len, "micro_batches_per_step": 1,
                  "world_size": 1, "pieces": "two halves of the micro-batch"},
        "step_cpu_s_median": step_cpu, "step_wall_s_median": step_wall,
        "measurement_extra_cpu_s_median": extra_cpu, "measurement_extra_wall_s_median": extra_wall,
        "measurement_over_step_cpu": extra_cpu / step_cpu, "measurement_over_step_wall": extra_wall / step_wall,
        "smallest_noise_every_within_2pct_cpu": math.ceil(extra_cpu / (BUDGET * step_cpu)),
        "smallest_noise_every_within_2pct_wall": math.ceil(extra_wall / (BUDGET * step_wall)),
        "default_noise_every": default,
        "default_cost_cpu": extra_cpu / (default * step_cpu), "default_cost_wall": extra_wall / (default * step_wall),
        "estimates_logged": len(estimates), "last_estimate": estimates[-1] if estimates else None,
        "cpu_s": {"measured": cpu[True], "not_measured": cpu[False]},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20, help="pairs of steps (measured, not measured)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--data-dir", type=Path, help="a prepared corpus with a 30k tokenizer (default: prepare one)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-noise-") as tmp:
        result = run(args, Path(tmp))
    import deepspeed
    import torch

    from launcher.common.io import atomic_write_json

    result["environment"] = {
        "torch": torch.__version__, "deepspeed": deepspeed.__version__, "threads": args.threads,
        "cpu_count": os.cpu_count(), "machine": platform.machine(), "rounds": args.rounds,
        "load_average_start": load_before, "load_average_end": os.getloadavg(),
        "note": ("quiet machine (1-minute load below 1 at the start)" if load_before[0] < 1 else
                 f"shared machine (1-minute load {load_before[0]:.1f} at the start): the CPU-time medians are the "
                 "figures; rerun on a quiet machine for wall time") + ": paired steps in one process",
        "measured_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    atomic_write_json(args.out, result)
    print(json.dumps({k: v for k, v in result.items() if k != "cpu_s"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

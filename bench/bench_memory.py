"""`roformer plan`'s memory estimate against real `roformer pretrain` runs on this CPU: 1 and 2 ranks at
two shapes.

    DS_ACCELERATOR=cpu .venv/bin/python bench/bench_memory.py [--steps 3] [--malloc live|default]

Each run is the real command (DeepSpeed's launcher, ZeRO-2 fp32 ranks, metrics, heartbeats) on a
corpus prepared on the fly (30k-piece tokenizer, about 5 s). Measured per rank (tests/support/memory_probe.py):
the resident high-water mark while training (VmHWM, not torch's allocator: CPU tensors have no
allocator statistics) and rank 0's resident memory before the model exists. The estimate's
model-dependent part (model states + buckets + the larger of activations and the optimizer step's
temporaries) is compared with peak minus that fixed part; the fixed part is reported next to the
estimator's runtime allowance.

--malloc live (the default) runs the ranks with glibc's mmap threshold fixed at 64 KiB
(MALLOC_MMAP_THRESHOLD_), so a freed tensor leaves the resident set at once and RSS follows what
is allocated, as torch's allocator statistics do on a GPU; --malloc default keeps glibc's dynamic
threshold, whose retained free memory a CPU user sees on top. Each mode is stored under its own
key of bench/results/memory.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.bench_overhead import DS_CONFIG, prepare_corpus  # noqa: E402
from launcher.common.io import atomic_write_json  # noqa: E402
from tests.support.helpers import roformer_env, start_roformer, tiny_run_config  # noqa: E402
from tests.support.memory_probe import estimated_model_bytes, watch  # noqa: E402

RESULTS = REPO / "bench" / "results" / "memory.json"
VOCAB = 30000
# (name, model fields, seq_len, micro-batch per rank)
SHAPES = [
    ("issue h256 L4, 8 x 512", dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                    intermediate_size=1024), 512, 8),
    ("wide h512 L4, 16 x 128", dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                                    intermediate_size=2048), 128, 16),
]
TOLERANCE = 0.25
MALLOC_ENV = {"live": {"MALLOC_MMAP_THRESHOLD_": "65536"}, "default": {}}


def write_config(root: Path, data_dir: Path, model: dict, seq_len: int, micro: int, ranks: int, steps: int) -> Path:
    stage = {"name": "measured", "max_seq_len": seq_len, "global_batch_size": micro * ranks,
             "micro_batch_size": micro, "steps": steps}
    return tiny_run_config(root, data_dir, ds_config=DS_CONFIG.name, stages=[stage], seed=1,
                           model={"vocab_size": VOCAB, **model, "hidden_dropout_prob": 0.1,
                                  "attention_probs_dropout_prob": 0.1},
                           optimizer={"lr": 1e-4, "warmup_steps": 1}, checkpoint={"every_steps": 0, "keep_last": 1},
                           logging={"valid_batches": 1, "progress_bar": False, "peak_tflops": 1.0})


def measure(root: Path, data_dir: Path, shape, ranks: int, steps: int, timeout: float, malloc: str) -> dict:
    name, model, seq_len, micro = shape
    config = write_config(root, data_dir, model, seq_len, micro, ranks, steps)
    run_dir = root / "run"
    proc = start_roformer("pretrain", "--num_gpus", str(ranks), "--config", str(config), "--run-dir", str(run_dir),
                          env=roformer_env(**MALLOC_ENV[malloc]), log=root / "run.log")
    measured = watch(proc, run_dir, ranks, timeout)
    estimate = estimated_model_bytes(config, ranks)
    per_rank = {rank: measured.model_dependent_bytes(rank) for rank in measured.peak_bytes}
    worst = max(per_rank.values(), key=lambda value: abs(value / estimate["model_dependent"] - 1))
    return {"shape": name, "ranks": ranks, "seq_len": seq_len, "micro_batch_per_rank": micro, "steps": measured.steps,
            "estimate_bytes": estimate, "measured_peak_rss_bytes": measured.peak_bytes,
            "measured_before_model_bytes": measured.before_model_bytes,
            "measured_model_dependent_bytes": per_rank,
            "ratio_measured_over_estimate": worst / estimate["model_dependent"],
            "within_tolerance": abs(worst / estimate["model_dependent"] - 1) <= TOLERANCE,
            "load_1min": os.getloadavg()[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=240, help="seconds per run")
    parser.add_argument("--malloc", choices=sorted(MALLOC_ENV), default="live")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    load_before = os.getloadavg()
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        data_dir = Path(tmp) / "data"
        prepare_corpus(data_dir, VOCAB)
        for index, shape in enumerate(SHAPES):
            for ranks in (1, 2):
                root = Path(tmp) / f"shape{index}-ranks{ranks}"
                root.mkdir()
                runs.append(measure(root, data_dir, shape, ranks, args.steps, args.timeout, args.malloc))
                print(json.dumps({key: runs[-1][key] for key in ("shape", "ranks", "ratio_measured_over_estimate",
                                                                  "measured_before_model_bytes")}), flush=True)
    from launcher.pricing.estimate import CPU_RUNTIME_ALLOWANCE_BYTES

    result = json.loads(args.out.read_text()) if args.out.exists() else {}
    result.update({
        "what": "per-rank memory of real `roformer pretrain` runs (ZeRO-2, fp32, CPU) vs roformer plan's estimate",
        "measured_as": "resident set high-water mark (VmHWM) of each rank process while its heartbeat says 'train' "
                       "(not torch's tracked allocations: CPU tensors have none), minus rank 0's resident memory "
                       "before the model exists (startup event)",
        "tolerance": TOLERANCE, "cpu_runtime_allowance_bytes": CPU_RUNTIME_ALLOWANCE_BYTES})
    result[f"malloc_{args.malloc}"] = {
        "malloc": MALLOC_ENV[args.malloc] or "glibc defaults (dynamic mmap threshold)",
        "all_within_tolerance": all(run["within_tolerance"] for run in runs),
        "runs": runs,
        "environment": {"cpu_count": os.cpu_count(), "machine": platform.machine(), "steps": args.steps,
                        "load_average_start": load_before, "load_average_end": os.getloadavg(),
                        "revision": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                                   capture_output=True, text=True).stdout.strip(),
                        "measured_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}}
    atomic_write_json(args.out, result)
    print(json.dumps({"all_within_tolerance": result[f"malloc_{args.malloc}"]["all_within_tolerance"],
                      "ratios": [(r["shape"], r["ranks"], round(r["ratio_measured_over_estimate"], 3)) for r in runs]},
                     indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

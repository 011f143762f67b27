"""Full MLM training step of our RoFormer vs transformers' RoFormerForMaskedLM, side by side in one run.

    DS_ACCELERATOR=cpu .venv/bin/python bench/bench_model.py --label after [--iters 8] [--threads 2]

One step = zero_grad + forward + loss + backward + AdamW step, fp32, train mode (dropout on, the
same probabilities in both models), identical initial weights and batch. Measured in one process:
- P1: our tokens/s over transformers' tokens/s.
- P2: our needed model FLOP/s (roformer.flops.training_flops: masked-only head, attention term) over
  the fp32 matmul peak of this CPU (2048 x 2048 x 2048 matmul at the same thread count), the peak
  being probed between the model steps so that load from other jobs hits both alike.
- P3: RoPE's share of our step: fwd+bwd of the rotary embedding on the step's own q/k shapes, timed
  in the same run, over our step time; plus a torch.profiler table of the step's top operators.
Steps alternate round-robin and each figure is the median over --iters rounds (the machine is
shared; the load average is recorded). With --baseline-rev REV the roformer package of git revision
REV is loaded as a third model (same weights, same batch) and measured in the same rounds, so the
before/after figures come from one run. Results go to bench/results/model.json under --label.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import transformers  # noqa: E402

from roformer import IGNORE_INDEX, RoFormerConfig, RoFormerForMaskedLM, save_pretrained  # noqa: E402
from roformer.flops import forward_flops, training_flops  # noqa: E402
from roformer.rope import RotaryEmbedding  # noqa: E402
from tests.support.helpers import extract_archive  # noqa: E402
from launcher.gpu_check.side_by_side import (MASK_RATE, adamw, make_batch, medians, round_robin,  # noqa: E402
                                             training_step)

SHAPE = dict(vocab_size=30000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
             hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
PEAK_MATMUL_SIZE = 2048
RESULTS = Path(__file__).resolve().parent / "results" / "model.json"


def matmul_probe(size: int = PEAK_MATMUL_SIZE, repeats: int = 3) -> Callable[[], float]:
    """Returns a function measuring fp32 matmul GFLOP/s (best of `repeats` back-to-back products)."""
    generator = torch.Generator().manual_seed(1)
    a, b = torch.randn(size, size, generator=generator), torch.randn(size, size, generator=generator)
    out = torch.empty(size, size)

    def probe() -> float:
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(a, b, out=out)
            best = min(best, time.perf_counter() - start)
        return 2.0 * size ** 3 / best / 1e9
    return probe


def rope_step_seconds(apply_rotary: Callable, config: RoFormerConfig, batch_size: int, seq_len: int,
                      repeats: int = 5) -> float:
    """Median time of all of one step's RoPE work: fwd+bwd of q and k in every layer, at the step's shapes."""
    rope = RotaryEmbedding(config.head_size, config.rope_theta)
    cos, sin = rope.cos_sin(seq_len, torch.device("cpu"))
    heads = config.num_attention_heads
    # q/k as the attention makes them: a (B, T, H, D) projection viewed as (B, H, T, D).
    x = torch.randn(batch_size, seq_len, heads, config.head_size).transpose(1, 2).requires_grad_()
    grad = torch.randn(batch_size, heads, seq_len, config.head_size)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(2 * config.num_hidden_layers):
            apply_rotary(x, cos, sin).backward(grad)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def profile_table(step: Callable[[], None], steps: int = 2, top: int = 15) -> list[dict]:
    """Top operators by self CPU time over `steps` steps, with their share of the profiled total."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    return [{"op": e.key, "self_share": round(e.self_cpu_time_total / total, 4), "calls_per_step": e.count // steps,
             "self_ms_per_step": round(e.self_cpu_time_total / 1e3 / steps, 1)} for e in events[:top]]


ROOT = Path(__file__).resolve().parents[1]


def git_revision() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "roformer"], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+uncommitted roformer/ changes" if dirty else "")


def load_baseline_package(revision: str, workdir: Path):
    """roformer/ as of git `revision`, imported as the package `roformer_baseline`."""
    archive = workdir / "baseline.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "archive", "--format=tar", revision, "roformer"], cwd=ROOT, stdout=out, check=True)
    extract_archive(archive, workdir / "baseline")
    package = workdir / "baseline" / "roformer"
    spec = importlib.util.spec_from_file_location("roformer_baseline", package / "__init__.py",
                                                  submodule_search_locations=[str(package)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["roformer_baseline"] = module
    spec.loader.exec_module(module)
    return module


def run(batch_size: int, seq_len: int, iters: int, workdir: Path, baseline_rev: str | None) -> dict:
    torch.manual_seed(0)
    config = RoFormerConfig(**SHAPE)
    ours = RoFormerForMaskedLM(config).train()
    export = save_pretrained(ours, workdir / "export", overwrite=True)
    theirs = transformers.RoFormerForMaskedLM.from_pretrained(export).train()
    batch = make_batch(config.vocab_size, batch_size, seq_len)
    num_masked = int((batch["labels"] != IGNORE_INDEX).sum())
    tokens = batch_size * seq_len
    steps = {"ours": training_step(ours, adamw(ours), batch),
             "transformers": training_step(theirs, adamw(theirs), batch)}
    rotaries = {"ours": sys.modules["roformer.rope"].apply_rotary}
    if baseline_rev:
        package = load_baseline_package(baseline_rev, workdir)
        baseline = package.RoFormerForMaskedLM(package.RoFormerConfig(**SHAPE)).train()
        baseline.load_state_dict(ours.state_dict())
        steps["baseline"] = training_step(baseline, adamw(baseline), batch)
        rotaries["baseline"] = sys.modules["roformer_baseline.rope"].apply_rotary

    probe = matmul_probe()
    # Rounds: the matmul peak and the load between the models, each model's step wall / CPU time.
    samples = round_robin(steps, iters, between={"matmul_gflops": probe, "load_1min": lambda: os.getloadavg()[0]})
    median = medians(samples)
    needed = training_flops(config, batch_size, seq_len, num_masked)
    peak = median["matmul_gflops"]

    models = {}
    for name in steps:
        seconds = median[f"{name}_wall_s"]
        entry = {"step_wall_s": seconds, "step_cpu_s": median[f"{name}_cpu_s"], "tokens_per_s": tokens / seconds,
                 "needed_gflops": needed / seconds / 1e9, "fraction_of_matmul_peak": needed / seconds / 1e9 / peak}
        if name != "transformers":
            entry["speedup_vs_transformers"] = median["transformers_wall_s"] / seconds
            entry["speedup_vs_transformers_cpu_time"] = median["transformers_cpu_s"] / median[f"{name}_cpu_s"]
            rope_s = rope_step_seconds(rotaries[name], config, batch_size, seq_len)
            entry["rope_seconds_per_step"] = rope_s
            entry["rope_share_of_step"] = rope_s / seconds
        models[name] = entry
    profiles = {name: profile_table(steps[name]) for name in steps if name != "transformers"}
    goals = {"P1_speedup_vs_transformers": models["ours"]["speedup_vs_transformers"],
             "P2_fraction_of_matmul_peak": models["ours"]["fraction_of_matmul_peak"],
             "P3_rope_share_of_step": models["ours"]["rope_share_of_step"]}
    if "baseline" in models:
        goals["before_" + baseline_rev] = {
            "P1_speedup_vs_transformers": models["baseline"]["speedup_vs_transformers"],
            "P2_fraction_of_matmul_peak": models["baseline"]["fraction_of_matmul_peak"],
            "P3_rope_share_of_step": models["baseline"]["rope_share_of_step"]}
    return {
        "goals": goals,
        "shape": {**SHAPE, "batch_size": batch_size, "seq_len": seq_len, "tokens_per_step": tokens,
                  "mask_rate": MASK_RATE, "num_masked": num_masked},
        "needed_flops_per_step": {"training_total": needed, "forward_by_part": {
            name: value for name, value in vars(forward_flops(config, batch_size, seq_len, num_masked)).items()}},
        "matmul_peak_gflops": peak,
        "models": models,
        "medians": median,
        "samples": samples,
        "profile_top_ops": profiles,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", required=True, help="key of this run in the JSON, e.g. before / after")
    parser.add_argument("--iters", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--baseline-rev", help="git revision whose roformer/ is measured alongside, e.g. 79e38a0")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    workdir = args.out.parent / f".bench_model_tmp_{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    try:
        result = run(args.batch_size, args.seq_len, args.iters, workdir, args.baseline_rev)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result["environment"] = {
        "torch": torch.__version__, "transformers": transformers.__version__, "threads": args.threads,
        "cpu_count": os.cpu_count(), "machine": platform.machine(), "processor": platform.processor(),
        "roformer_revision": git_revision(), "baseline_revision": args.baseline_rev, "iters": args.iters,
        "load_average_start": load_before, "load_average_end": os.getloadavg(),
        "note": "shared machine: ratios are measured side by side (round-robin), wall-time medians",
        "measured_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    report = json.loads(args.out.read_text()) if args.out.exists() else {}
    if "runs" not in report or not isinstance(report.get("runs"), dict):
        report = {"benchmark": "MLM training step (zero_grad, forward, masked-only loss, backward, AdamW), "
                               "fp32, dropout 0.1/0.1, ours vs transformers' RoFormerForMaskedLM", "runs": {}}
    report["runs"][args.label] = result
    from launcher.common.io import atomic_write_json

    atomic_write_json(args.out, report)
    print(json.dumps({"label": args.label, "goals": result["goals"], "matmul_peak_gflops": result["matmul_peak_gflops"],
                      "tokens_per_s": {name: m["tokens_per_s"] for name, m in result["models"].items()},
                      "load": result["environment"]["load_average_end"],
                      "top_ops": {name: table[:8] for name, table in result["profile_top_ops"].items()}}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

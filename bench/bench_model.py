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
shared; the load average is recorded). Results go to bench/results/model.json under --label, so the
'before' and 'after' runs sit next to each other.
"""

from __future__ import annotations

import argparse
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
from roformer.rope import RotaryEmbedding, apply_rotary  # noqa: E402

SHAPE = dict(vocab_size=30000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
             hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
MASK_RATE = 0.15
PEAK_MATMUL_SIZE = 2048
RESULTS = Path(__file__).resolve().parent / "results" / "model.json"


def make_batch(vocab_size: int, batch_size: int, seq_len: int, seed: int = 0):
    """Full-length rows (as packed pretraining rows), MASK_RATE of positions carry a label."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, vocab_size, (batch_size, seq_len), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    masked = torch.rand(batch_size, seq_len, generator=generator) < MASK_RATE
    labels[masked] = input_ids[masked]
    return input_ids, attention_mask, labels


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


def timed(step: Callable[[], None]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    step()
    return time.perf_counter() - wall, time.process_time() - cpu


def rope_step_seconds(config: RoFormerConfig, batch_size: int, seq_len: int, repeats: int = 5) -> float:
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


def git_revision() -> str:
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "roformer"], cwd=root, capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+uncommitted roformer/ changes" if dirty else "")


def run(batch_size: int, seq_len: int, iters: int, workdir: Path) -> dict:
    torch.manual_seed(0)
    config = RoFormerConfig(**SHAPE)
    ours = RoFormerForMaskedLM(config).train()
    export = save_pretrained(ours, workdir / "export", overwrite=True)
    theirs = transformers.RoFormerForMaskedLM.from_pretrained(export).train()
    input_ids, attention_mask, labels = make_batch(config.vocab_size, batch_size, seq_len)
    num_masked = int((labels != IGNORE_INDEX).sum())
    tokens = batch_size * seq_len
    ours_optimizer = torch.optim.AdamW(ours.parameters(), lr=1e-4)
    theirs_optimizer = torch.optim.AdamW(theirs.parameters(), lr=1e-4)

    def ours_step() -> None:
        ours_optimizer.zero_grad(set_to_none=True)
        ours(input_ids, attention_mask, labels=labels).loss.backward()
        ours_optimizer.step()

    def theirs_step() -> None:
        theirs_optimizer.zero_grad(set_to_none=True)
        theirs(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
        theirs_optimizer.step()

    probe = matmul_probe()
    for _ in range(2):  # warm-up: allocator, oneDNN primitives, optimizer state
        ours_step(), theirs_step(), probe()
    samples: dict[str, list[float]] = {"ours_wall_s": [], "ours_cpu_s": [], "transformers_wall_s": [],
                                       "transformers_cpu_s": [], "matmul_gflops": [], "load_1min": []}
    for _ in range(iters):
        samples["matmul_gflops"].append(probe())
        wall, cpu = timed(ours_step)
        samples["ours_wall_s"].append(wall), samples["ours_cpu_s"].append(cpu)
        wall, cpu = timed(theirs_step)
        samples["transformers_wall_s"].append(wall), samples["transformers_cpu_s"].append(cpu)
        samples["load_1min"].append(os.getloadavg()[0])
    median = {name: statistics.median(values) for name, values in samples.items()}
    rope_s = rope_step_seconds(config, batch_size, seq_len)
    profile = profile_table(ours_step)

    needed = training_flops(config, batch_size, seq_len, num_masked)
    achieved_gflops = needed / median["ours_wall_s"] / 1e9
    return {
        "shape": {**SHAPE, "batch_size": batch_size, "seq_len": seq_len, "tokens_per_step": tokens,
                  "mask_rate": MASK_RATE, "num_masked": num_masked},
        "needed_flops_per_step": {"training_total": needed, "forward_by_part": {
            name: value for name, value in vars(forward_flops(config, batch_size, seq_len, num_masked)).items()}},
        "tokens_per_s": {"ours": tokens / median["ours_wall_s"],
                         "transformers": tokens / median["transformers_wall_s"]},
        "P1_speedup_vs_transformers": median["transformers_wall_s"] / median["ours_wall_s"],
        "P1_speedup_cpu_time": median["transformers_cpu_s"] / median["ours_cpu_s"],
        "matmul_peak_gflops": median["matmul_gflops"],
        "ours_needed_gflops": achieved_gflops,
        "P2_fraction_of_matmul_peak": achieved_gflops / median["matmul_gflops"],
        "P3_rope_share_of_step": rope_s / median["ours_wall_s"],
        "rope_seconds_per_step": rope_s,
        "medians": median,
        "samples": samples,
        "profile_ours_top_ops": profile,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", required=True, help="key of this run in the JSON, e.g. before / after")
    parser.add_argument("--iters", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    workdir = args.out.parent / f".bench_model_tmp_{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    try:
        result = run(args.batch_size, args.seq_len, args.iters, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result["environment"] = {
        "torch": torch.__version__, "transformers": transformers.__version__, "threads": args.threads,
        "cpu_count": os.cpu_count(), "machine": platform.machine(), "processor": platform.processor(),
        "roformer_revision": git_revision(), "iters": args.iters,
        "load_average_start": load_before, "load_average_end": os.getloadavg(),
        "note": "shared machine: ratios are measured side by side (round-robin), wall-time medians",
        "measured_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    report = json.loads(args.out.read_text()) if args.out.exists() else {}
    if "runs" not in report or not isinstance(report.get("runs"), dict):
        report = {"benchmark": "MLM training step (zero_grad, forward, masked-only loss, backward, AdamW), "
                               "fp32, dropout 0.1/0.1, ours vs transformers' RoFormerForMaskedLM", "runs": {}}
    report["runs"][args.label] = result
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(tmp, args.out)
    summary = {key: result[key] for key in ("tokens_per_s", "P1_speedup_vs_transformers", "matmul_peak_gflops",
                                            "ours_needed_gflops", "P2_fraction_of_matmul_peak",
                                            "P3_rope_share_of_step")}
    print(json.dumps({"label": args.label, **summary, "load": result["environment"]["load_average_end"],
                      "top_ops": result["profile_ours_top_ops"][:8]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

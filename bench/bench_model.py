"""Forward+backward time of the demo-size MLM: masked-only vs full logits, ours vs transformers' RoFormer.

    DS_ACCELERATOR=cpu .venv/bin/python bench/bench_model.py [--iters 10] [--threads 2]

Writes bench/results/model.json. Each variant gets identical weights and batches; time is the median
over --iters steps after warm-up, variants alternating step by step (a shared machine is noisy).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import transformers  # noqa: E402

from roformer import IGNORE_INDEX, RoFormerConfig, RoFormerForMaskedLM, save_pretrained  # noqa: E402

DEMO = dict(vocab_size=8000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)
MASK_RATE = 0.15


def make_batch(vocab_size: int, batch_size: int, seq_len: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, vocab_size, (batch_size, seq_len), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    masked = torch.rand(batch_size, seq_len, generator=generator) < MASK_RATE
    labels[masked] = input_ids[masked]
    return input_ids, attention_mask, labels


def time_round_robin(steps: dict, iters: int, warmup: int = 2) -> dict:
    """Alternate the variants step by step so that load from other jobs hits them alike.

    Records wall time and this process's CPU time; on a shared machine with one thread the CPU time
    is the robust number (waiting for a core is not counted), on a quiet machine the two agree.
    """
    for _ in range(warmup):
        for step in steps.values():
            step()
    wall = {name: [] for name in steps}
    cpu = {name: [] for name in steps}
    for _ in range(iters):
        for name, step in steps.items():
            wall_start, cpu_start = time.perf_counter(), time.process_time()
            step()
            cpu[name].append(time.process_time() - cpu_start)
            wall[name].append(time.perf_counter() - wall_start)
    return {name: {"cpu_median_s": statistics.median(cpu[name]), "wall_median_s": statistics.median(wall[name]),
                   "wall_min_s": min(wall[name]), "iters": iters} for name in steps}


def bench_vocab(vocab_size: int, batch_size: int, seq_len: int, iters: int, workdir: Path) -> dict:
    torch.manual_seed(0)
    ours = RoFormerForMaskedLM(RoFormerConfig(**{**DEMO, "vocab_size": vocab_size})).train()
    export = save_pretrained(ours, workdir / f"export-{vocab_size}", overwrite=True)
    theirs = transformers.RoFormerForMaskedLM.from_pretrained(export).train()
    input_ids, attention_mask, labels = make_batch(vocab_size, batch_size, seq_len)

    def ours_masked_only():
        ours.zero_grad(set_to_none=True)
        ours(input_ids, attention_mask, labels=labels).loss.backward()

    def ours_full_logits():
        ours.zero_grad(set_to_none=True)
        logits = ours(input_ids, attention_mask).logits  # (B, T, V)
        F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX).backward()

    def transformers_full_logits():
        theirs.zero_grad(set_to_none=True)
        theirs(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss.backward()

    results = time_round_robin({
        "ours_masked_only_logits": ours_masked_only,
        "ours_full_logits": ours_full_logits,
        "transformers_full_logits": transformers_full_logits,
    }, iters)
    def speedup(slow: str, fast: str) -> float:
        return results[slow]["cpu_median_s"] / results[fast]["cpu_median_s"]

    return {
        "config": {**DEMO, "vocab_size": vocab_size, "batch_size": batch_size, "seq_len": seq_len,
                   "mask_rate": MASK_RATE, "num_masked": int((labels != IGNORE_INDEX).sum())},
        "fwd_bwd": results,
        "cpu_time_speedup_masked_only_vs_full": speedup("ours_full_logits", "ours_masked_only_logits"),
        "cpu_time_speedup_ours_masked_only_vs_transformers":
            speedup("transformers_full_logits", "ours_masked_only_logits"),
        "cpu_time_speedup_ours_full_vs_transformers": speedup("transformers_full_logits", "ours_full_logits"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="1 makes CPU time a fair measure on a shared machine")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--vocab-sizes", type=int, nargs="+", default=[8000, 30000])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "model.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    workdir = args.out.parent / ".bench_model_tmp"
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        runs = [bench_vocab(v, args.batch_size, args.seq_len, args.iters, workdir) for v in args.vocab_sizes]
    finally:
        import shutil
        shutil.rmtree(workdir, ignore_errors=True)
    report = {
        "benchmark": "MLM forward+backward step (zero_grad, forward, loss, backward), demo-size RoFormer, CPU fp32, train mode",
        "environment": {"torch": torch.__version__, "transformers": transformers.__version__,
                        "threads": args.threads, "cpu_count": os.cpu_count(), "machine": platform.machine(),
                        "note": "shared machine: other jobs may have run concurrently"},
        "runs": runs,
        "measured_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(tmp, args.out)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`model.compile` on the CPU: the eager training step (roformer/cpu_kernels) against the same step with each encoder
layer compiled by inductor (RoFormerForMaskedLM.compile_layers, what build_engine does when model.compile is on).

    DS_ACCELERATOR=cpu .venv/bin/python bench/bench_compile.py [--iters 8] [--threads 2]

One step = zero_grad + forward + loss + backward + AdamW step, fp32, train mode (dropout on), the same weights and
batch; steps alternate round-robin and each figure is the median over --iters rounds (bench/bench_model.py's method;
the load average is recorded, the machine is shared). Shapes: 'tiny' (the tests' model, the tiny_cpu schedule's
first stage), 'small' (bench_model.py's h256/L4/V30k at 8 x 128) and 'bench' (the same at bench_model.py's
16 x 512, where the CPU attention-dropout kernel matters most). Also: the first compiled step's seconds (the
compile), and inductor's losses and gradients against eager's without dropout (the eager GPU path: the same ops,
and the CPU-kernel path this machine runs). Results: bench/results/compile_cpu.json.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import roformer.cpu_kernels as cpu_kernels  # noqa: E402
from launcher.gpu_check.side_by_side import adamw, make_batch, medians, round_robin, training_step  # noqa: E402
from roformer import RoFormerConfig, RoFormerForMaskedLM  # noqa: E402

SHAPES = {
    "tiny": (dict(vocab_size=900, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64),
             8, 64),
    "small": (dict(vocab_size=30000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                   intermediate_size=1024), 8, 128),
    "bench": (dict(vocab_size=30000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                   intermediate_size=1024), 16, 512),
}
DROPOUT = dict(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
RESULTS = Path(__file__).resolve().parent / "results" / "compile_cpu.json"


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def differences(config: RoFormerConfig, batch: dict) -> dict:
    """Inductor-compiled layers vs eager, dropout off: relative loss difference and the gradient's (global norm,
    and the worst tensor but the key biases, whose gradient is 0 but for rounding)."""
    torch.manual_seed(0)
    eager = RoFormerForMaskedLM(RoFormerConfig(**{**config.to_dict(), "hidden_dropout_prob": 0.0,
                                                  "attention_probs_dropout_prob": 0.0})).train()
    compiled = copy.deepcopy(eager)
    compiled.compile_layers(backend="inductor")

    def run(model):
        model.zero_grad()
        out = model(**batch)
        out.loss_sum.backward()
        return out.loss_sum.item(), [(n, p.grad.clone()) for n, p in model.named_parameters()]

    loss_c, grads_c = run(compiled)
    result = {}
    for name, gpu_path in (("vs_eager_gpu_path", True), ("vs_eager_cpu_kernels", False)):
        original = cpu_kernels.use_cpu_kernels
        if gpu_path:
            cpu_kernels.use_cpu_kernels = lambda tensor: False
        try:
            loss_e, grads_e = run(eager)
        finally:
            cpu_kernels.use_cpu_kernels = original
        diff = torch.cat([(a - b).flatten() for (_, a), (_, b) in zip(grads_c, grads_e)]).norm()
        total = torch.cat([b.flatten() for _, b in grads_e]).norm()
        worst = max(float((a - b).norm() / b.norm()) for (n, a), (_, b) in zip(grads_c, grads_e)
                    if not n.endswith("attention.key.bias"))
        result[name] = {"loss_relative": abs(loss_c - loss_e) / abs(loss_e), "grad_relative": float(diff / total),
                        "worst_tensor_grad_relative": worst}
    return result


def run_shape(name: str, iters: int) -> dict:
    fields, batch_size, seq_len = SHAPES[name]
    config = RoFormerConfig(**fields, **DROPOUT)
    batch = make_batch(config.vocab_size, batch_size, seq_len)
    torch.manual_seed(0)
    eager = RoFormerForMaskedLM(config).train()
    compiled = copy.deepcopy(eager)
    compiled.compile_layers(backend="inductor")
    steps = {"eager": training_step(eager, adamw(eager), batch), "compiled": training_step(compiled, adamw(compiled),
                                                                                         batch)}
    start = time.perf_counter()
    steps["compiled"]()  # compiles forward and backward
    compile_s = time.perf_counter() - start
    load_before = load()
    samples = round_robin(steps, iters)
    figures = medians(samples)
    tokens = batch_size * seq_len
    return {"shape": {**fields, "batch_size": batch_size, "seq_len": seq_len},
            "eager_step_s": round(figures["eager_wall_s"], 5), "compiled_step_s": round(figures["compiled_wall_s"], 5),
            "eager_tokens_per_s": round(tokens / figures["eager_wall_s"]),
            "compiled_tokens_per_s": round(tokens / figures["compiled_wall_s"]),
            "compiled_over_eager_time": round(figures["compiled_wall_s"] / figures["eager_wall_s"], 3),
            "first_compiled_step_s": round(compile_s, 1), "load_before": load_before, "load_after": load(),
            "numerics_no_dropout": differences(config, batch)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                           "threads": args.threads, "torch": torch.__version__,
                           "uptime_load_at_start": load()},
               "iters": args.iters, "shapes": {}}
    for name in args.shapes:
        results["shapes"][name] = run_shape(name, args.iters)
        print(json.dumps({name: results["shapes"][name]}), flush=True)
    results["machine"]["uptime_load_at_end"] = load()
    if RESULTS.exists():  # shapes measured by an earlier run (another --shapes) are kept, with their machine line
        earlier = json.loads(RESULTS.read_text())
        for name, figures in earlier.get("shapes", {}).items():
            if name not in results["shapes"]:
                results["shapes"][name] = {**figures, "machine": figures.get("machine", earlier.get("machine"))}
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()

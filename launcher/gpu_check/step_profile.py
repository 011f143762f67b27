"""Part (e) of `roformer gpu-check`: where a GPU training step's time goes (issue 48, item 1).

At the BERT-base shape, lengths 128 and 512, in each half precision the card has (bf16 where it exists, and
fp16 as a V100 trains), at two micro-batches: the reference 8,192 tokens per step and the largest micro-batch
that `roformer plan`'s memory model fits in PLAN_HEADROOM of the card. Three steps side by side: our model
under autocast with torch's AdamW, transformers' RoFormerForMaskedLM the same way, and our DeepSpeed engine
(ZeRO-2, DeepSpeed's optimizer: FusedAdam on a GPU; fp16 with loss scaling or bf16, as training runs).
Each row: tokens/s and MFU of the three, peak memory, and a torch.profiler summary of one engine step (the
kernels with the most device time, which attention kernel ran, the share of the step the device sat idle).

Device-agnostic so that its logic is tested on CPU (tests/unit/test_step_profile.py: a tiny model, fp32).
"""
from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from launcher.common.mfu import table_peak_tflops
from launcher.gpu_check.side_by_side import adamw, make_batch, medians, round_robin, training_step
from roformer import IGNORE_INDEX, RoFormerConfig, RoFormerForMaskedLM, save_pretrained
from roformer.flops import training_flops
from launcher.gpu_check.speed_memory import half_precision, init_single_rank
from launcher.pricing.estimate import largest_fitting_micro_batch, setup_from_configs

REPO = Path(__file__).resolve().parents[2]
REFERENCE_TOKENS = 8192
PLAN_HEADROOM = 0.85
"""Share of the card's memory the planned micro-batch may fill (the rest: allocator slack, the CUDA context)."""
TOP_KERNELS = 12
ATTENTION_KERNELS = (("flash", "flash"), ("fmha", "memory-efficient"), ("efficient", "memory-efficient"),
                     ("cudnn", "cudnn"), ("dropoutattention", "ours (CPU)"))
"""Substrings of a profiled event's name -> the attention implementation that ran (the first match wins; ours
is roformer/cpu_kernels/attention.py's autograd function)."""


@dataclass
class ProfiledStep:
    """torch.profiler's view of one engine step."""

    top_kernels: list[tuple[str, float]]
    """(kernel, device milliseconds) with the most device time, most first."""
    attention: str
    """Which attention kernel ran (ATTENTION_KERNELS), 'math' when none of them."""
    busy_share: float
    """Device time of all kernels over the step's wall time (1 - busy_share: the device idle, waiting on the host)."""


@dataclass
class StepRow:
    precision: str
    seq_len: int
    micro_batch: int
    why: str
    """'reference 8,192 tokens' or 'plan: largest in 85% of N GiB'."""
    tokens_per_s: dict[str, float] = field(default_factory=dict)
    """'ours', 'transformers', 'engine' -> tokens per second."""
    mfu: dict[str, float] = field(default_factory=dict)
    peak_memory_gib: dict[str, float] = field(default_factory=dict)
    profile: ProfiledStep | None = None


def profile_steps(device: torch.device, model_config: RoFormerConfig, lengths=(128, 512), precisions=None,
                  iters: int = 10, ds_json: str = "v100_fp16_zero2.json", reference_tokens: int = REFERENCE_TOKENS,
                  say=print) -> list[StepRow]:
    """Every (precision, length, micro-batch) row; see the module docstring."""
    if precisions is None:
        precisions = [half_precision()[0]] + (["fp16"] if half_precision()[0] == "bf16" else [])
    init_single_rank(device)
    rows = []
    for precision in precisions:
        for seq_len in lengths:
            for micro, why in _micro_batches(device, model_config, precision, seq_len, ds_json, reference_tokens):
                say(f"gpu-check: profile {precision} {seq_len} x {micro} ({why})")
                rows.append(_row(device, model_config, precision, seq_len, micro, why, iters, ds_json))
    return rows


def _micro_batches(device, model_config, precision, seq_len, ds_json, tokens) -> list[tuple[int, str]]:
    reference = (max(1, tokens // seq_len), f"reference {tokens:,} tokens")
    if device.type != "cuda":
        return [reference]
    total = torch.cuda.get_device_properties(device).total_memory
    from launcher.config.deepspeed_json import DeepSpeedJson

    setup = setup_from_configs(model_config, DeepSpeedJson.from_config(_ds_config(ds_json, precision, 1)), 1,
                               activation_checkpointing=False, cpu_ranks=False)
    planned = largest_fitting_micro_batch(setup, seq_len, int(PLAN_HEADROOM * total), checkpointing=False)
    why = f"plan: largest in {PLAN_HEADROOM:.0%} of {total / 2 ** 30:.0f} GiB"
    return [reference] + ([(planned, why)] if planned > reference[0] else [])


def _row(device, model_config, precision, seq_len, micro, why, iters, ds_json) -> StepRow:
    import transformers

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[precision]
    torch.manual_seed(0)
    ours = RoFormerForMaskedLM(model_config).train()
    with tempfile.TemporaryDirectory() as tmp:
        theirs = transformers.RoFormerForMaskedLM.from_pretrained(save_pretrained(ours, Path(tmp) / "e")).train()
    engine = _engine(model_config, ds_json, precision, micro)
    ours, theirs = ours.to(device), theirs.to(device)
    batch = make_batch(model_config.vocab_size, micro, seq_len, device=device)
    masked = int((batch["labels"] != IGNORE_INDEX).sum())
    steps = {"ours": training_step(ours, adamw(ours), batch, dtype),
             "transformers": training_step(theirs, adamw(theirs), batch, dtype),
             "engine": _engine_step(engine, batch)}
    sync = _synchronize(device)
    times = medians(round_robin(steps, iters, synchronize=sync))
    peak = table_peak_tflops(torch.cuda.get_device_name(device), precision) if device.type == "cuda" else None
    flops = training_flops(model_config, micro, seq_len, masked)
    row = StepRow(precision, seq_len, micro, why)
    for name, step in steps.items():
        seconds = times[f"{name}_wall_s"]
        row.tokens_per_s[name] = micro * seq_len / seconds
        if peak:
            row.mfu[name] = flops / seconds / (peak * 1e12)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            step()
            sync()
            row.peak_memory_gib[name] = torch.cuda.max_memory_allocated(device) / 2 ** 30
    row.profile = profile_one_step(steps["engine"], device)
    del engine
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def profile_one_step(step, device: torch.device, repeats: int = 3) -> ProfiledStep:
    """`repeats` steps under torch.profiler: kernels by device time (CPU ops on a CPU), attention, busy share."""
    from torch.profiler import ProfilerActivity, profile

    on_gpu = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    sync = _synchronize(device)
    step()  # outside the profile: allocations and lazy initialisation
    sync()
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(repeats):
            step()
        sync()
        wall_us = (time.perf_counter() - start) * 1e6
    events = prof.key_averages()
    if on_gpu:
        timed = [(e.key, e.self_device_time_total) for e in events if e.self_device_time_total > 0]
    else:  # on a CPU the operators are the kernels
        timed = [(e.key, e.self_cpu_time_total) for e in events if e.key.startswith(("aten::", "roformer"))]
    timed.sort(key=lambda item: -item[1])
    names = " ".join(e.key.lower() for e in events)
    attention = next((label for key, label in ATTENTION_KERNELS if key in names), "math")
    busy = sum(us for _, us in timed) / wall_us if on_gpu else 1.0
    return ProfiledStep([(name, us / repeats / 1e3) for name, us in timed[:TOP_KERNELS]], attention, busy)


def _ds_config(ds_json: str, precision: str, micro: int) -> dict:
    config = json.loads((REPO / "ds_configs" / ds_json).read_text())
    config.update(train_batch_size=micro, train_micro_batch_size_per_gpu=micro, gradient_accumulation_steps=1,
                  steps_per_print=10 ** 9)
    if precision == "bf16":
        config["fp16"] = {"enabled": False}
        config["bf16"] = {"enabled": True}
    return config


def _engine(model_config: RoFormerConfig, ds_json: str, precision: str, micro: int):
    import deepspeed

    torch.manual_seed(0)
    model = RoFormerForMaskedLM(model_config)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=_ds_config(ds_json, precision, micro))
    return engine


def _engine_step(engine, batch: dict):
    """One optimizer step as the trainer takes it (engine forward, backward of the summed loss, step)."""
    def step() -> None:
        out = engine(**batch)
        engine.backward(out.loss)
        engine.step()
    return step


def _synchronize(device: torch.device):
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


"""Training steps of several models timed side by side in one process (round-robin, medians), shared by
bench/bench_model.py (CPU) and `roformer gpu-check`'s speed part (CUDA).

A step is zero_grad + forward + loss + backward + AdamW step on a fixed batch. Rounds alternate the
models so that whatever else the machine does hits all of them alike. On a GPU the clock is read only
after `synchronize()` (kernels run asynchronously: without it a step "ends" when its last kernel is
queued), before the step and after it.
"""
from __future__ import annotations

import statistics
import time
from contextlib import nullcontext
from typing import Callable

import torch

from roformer import IGNORE_INDEX

MASK_RATE = 0.15


def make_batch(vocab_size: int, batch_size: int, seq_len: int, seed: int = 0, device="cpu") -> dict:
    """Full-length rows (as packed pretraining rows), MASK_RATE of positions carry a label."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, vocab_size, (batch_size, seq_len), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    masked = torch.rand(batch_size, seq_len, generator=generator) < MASK_RATE
    labels[masked] = input_ids[masked]
    return {key: value.to(device) for key, value in
            {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}.items()}


def adamw(model) -> torch.optim.AdamW:
    """The trainer's optimizer settings (ds_configs/*.json: AdamW, betas 0.9/0.999, eps 1e-6, weight decay 0.01)."""
    return torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)


def training_step(model, optimizer, batch: dict, autocast_dtype: torch.dtype | None = None) -> Callable[[], None]:
    """One step; with autocast_dtype, forward and loss under torch.autocast on the batch's device."""
    device_type = batch["input_ids"].device.type

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        context = torch.autocast(device_type, dtype=autocast_dtype) if autocast_dtype else nullcontext()
        with context:
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
    return step


def timed(step: Callable[[], None], synchronize: Callable[[], None] = lambda: None) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one step, the device synchronized at both ends."""
    synchronize()
    wall, cpu = time.perf_counter(), time.process_time()
    step()
    synchronize()
    return time.perf_counter() - wall, time.process_time() - cpu


def round_robin(steps: dict[str, Callable[[], None]], iters: int, warmup: int = 2,
                synchronize: Callable[[], None] = lambda: None,
                between: dict[str, Callable[[], float]] | None = None) -> dict[str, list[float]]:
    """Samples per name: '<model>_wall_s', '<model>_cpu_s' for every step, one per round, and one per
    round of each `between` probe (e.g. a matmul peak, the load average), measured between the models."""
    for _ in range(warmup):  # allocator, kernels' autotuning, optimizer state
        for step in steps.values():
            step()
    samples: dict[str, list[float]] = {name: [] for name in (between or {})}
    for name in steps:
        samples[f"{name}_wall_s"], samples[f"{name}_cpu_s"] = [], []
    for _ in range(iters):
        for name, probe in (between or {}).items():
            samples[name].append(probe())
        for name, step in steps.items():
            wall, cpu = timed(step, synchronize)
            samples[f"{name}_wall_s"].append(wall)
            samples[f"{name}_cpu_s"].append(cpu)
    return samples


def medians(samples: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(values) for name, values in samples.items() if values}

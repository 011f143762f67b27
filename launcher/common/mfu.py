"""Model FLOP/s and MFU: the peak a rank is measured against, and one step's model FLOPs.

MFU = model FLOPs of a step (roformer/flops.py) / step time / peak FLOP/s of one rank's device. The peak,
in order: `logging.peak_tflops` (> 0); the table below, by device name and precision; on a CPU, a timed
fp32 matmul at start-up (a `peak_flops` event). Any other accelerator gets no MFU (TFLOP/s is still
reported).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from roformer import RoFormerConfig
from roformer.flops import training_flops

# Dense peak TFLOP/s per device from the vendors' data sheets (tensor cores for fp16 / bf16; plain
# fp32 without TF32). Matched by substring of the lower-cased product name; first match wins, so
# the more specific names come first. V100 has no bf16 (DeepSpeed refuses it there).
PEAK_TFLOPS_TABLE: tuple[tuple[str, dict[str, float]], ...] = (
    ("h100 pcie", {"fp16": 756.0, "bf16": 756.0, "fp32": 51.0}),
    ("h100", {"fp16": 989.0, "bf16": 989.0, "fp32": 67.0}),  # SXM
    ("h200", {"fp16": 989.0, "bf16": 989.0, "fp32": 67.0}),  # the H100 SXM's compute, more memory
    ("a100", {"fp16": 312.0, "bf16": 312.0, "fp32": 19.5}),
    ("v100", {"fp16": 125.0, "fp32": 15.7}),  # SXM2
)

# MFU this project measured, by device (a key of PEAK_TFLOPS_TABLE), precision and sequence length: what
# `roformer plan` prices time with where it has one (PlanMfu), each row with its record in bench/results/ and
# its date (tests/unit/test_mfu.py checks the rows against those records). Our training step, BERT-base shape,
# 8,192 tokens per step; a GPU measurement (launcher/gpu_check/speed_memory.py) adds its row here.
MEASURED_MFU: tuple[tuple[str, str, int, float, str, str], ...] = (
    # (device, precision, seq_len, mfu, record, date)
    ("h200", "bf16", 128, 0.0702, "bench/results/gpu_check_h200.json (numerics_speed_rerun)", "2026-11-27"),
    ("h200", "bf16", 512, 0.0815, "bench/results/gpu_check_h200.json (numerics_speed_rerun)", "2026-11-27"),
)
ASSUMED_MFU = 0.4
"""What `roformer plan` assumes where nothing was measured for the device and precision (--mfu sets it)."""


@dataclass(frozen=True)
class PlanMfu:
    """The MFU a plan prices time with: measured per sequence length (the nearest measured length serves a
    stage), or one figure (assumed, or --mfu)."""

    by_length: tuple[tuple[int, float], ...]
    """(sequence length, MFU) pairs; one pair with length 0 when the figure is the same for every length."""
    source: str
    """Printed beside the figure: 'assumed: ...', '--mfu', or 'measured: DEVICE PRECISION, RECORD, DATE'."""

    def at(self, seq_len: int) -> float:
        return min(self.by_length, key=lambda row: (abs(row[0] - seq_len), row[0]))[1]

    @property
    def label(self) -> str:
        if len(self.by_length) == 1:
            return f"{100 * self.by_length[0][1]:.3g}% MFU ({self.source})"
        figures = ", ".join(f"{100 * mfu:.3g}% at length {length}" for length, mfu in self.by_length)
        return f"MFU {figures} (the nearest length per stage; {self.source})"

    def to_dict(self) -> dict:
        return {"by_seq_len": {str(length): mfu for length, mfu in self.by_length}, "source": self.source}


def plan_mfu(device_name: str, precision: str, override: float | None = None) -> PlanMfu:
    """--mfu, else this project's measurement for the device (product name, matched as the peak table is) and
    precision, else ASSUMED_MFU, saying so."""
    if override is not None:
        return PlanMfu(((0, override),), "--mfu")
    lowered = device_name.lower()
    key = next((key for key, _ in PEAK_TFLOPS_TABLE if key in lowered), None)
    rows = [row for row in MEASURED_MFU if row[0] == key and row[1] == precision]
    if not rows:
        return PlanMfu(((0, ASSUMED_MFU),), f"assumed: nothing measured on {device_name or 'this device'} "
                                            f"{precision}; --mfu sets it")
    records = sorted({f"{row[4]}, {row[5]}" for row in rows})
    return PlanMfu(tuple((row[2], row[3]) for row in rows),
                   f"measured: {key.upper()} {precision}, {'; '.join(records)}")


# The CPU measurement: square fp32 matmuls timed for about this long (best repeat counts).
CPU_MATMUL_SIZE = 2048
CPU_MEASURE_SECONDS = 1.0


@dataclass(frozen=True)
class Peak:
    """The FLOP/s one rank is measured against."""

    tflops: float | None
    """Peak TFLOP/s of one rank's device (None: unknown, no MFU is reported)."""
    source: str
    """Where it came from: 'run config', 'table', 'measured' or 'unknown'."""
    device: str
    """The device's product name (or the accelerator's name when it has none)."""
    precision: str
    """fp16, bf16 or fp32: the column of the table used."""

    def to_dict(self) -> dict:
        return {"peak_tflops": self.tflops, "source": self.source, "device": self.device,
                "precision": self.precision}


def table_peak_tflops(device_name: str, precision: str) -> float | None:
    """The table's peak for a product name and precision (None when not listed)."""
    lowered = device_name.lower()
    for key, peaks in PEAK_TFLOPS_TABLE:
        if key in lowered:
            return peaks.get(precision)
    return None


def measure_matmul_tflops(size: int = CPU_MATMUL_SIZE, seconds: float = CPU_MEASURE_SECONDS) -> float:
    """Best fp32 TFLOP/s of (size x size) @ (size x size) on this process's CPU threads."""
    import torch

    # A generator of its own: ranks measure this after restoring a checkpoint's RNG state, and a draw
    # from the global one would shift every later dropout mask (a resumed run would not match).
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(size, size, generator=generator), torch.randn(size, size, generator=generator)
    torch.mm(a, b)  # warm-up (allocations, thread pool)
    best, deadline = float("inf"), time.perf_counter() + seconds
    while True:
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
        if time.perf_counter() > deadline:
            break
    return 2.0 * size ** 3 / best / 1e12


def device_product_name() -> tuple[str, bool]:
    """(product name of this rank's device, whether the accelerator is the CPU), via DeepSpeed's accelerator."""
    import torch
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    kind = accelerator.device_name()  # 'cpu', 'cuda', 'xpu', ... (no index: the kind)
    if kind == "cpu":
        import platform

        return platform.processor() or platform.machine() or "cpu", True
    module = torch.get_device_module(kind)
    get_name = getattr(module, "get_device_name", None)
    return (get_name(accelerator.current_device()) if get_name else kind), False


def resolve_peak(override_tflops: float, precision: str) -> Peak:
    """The peak for this rank (see the module docstring for the order)."""
    device, is_cpu = device_product_name()
    if override_tflops > 0:
        return Peak(override_tflops, "run config", device, precision)
    if is_cpu:
        return Peak(measure_matmul_tflops(), "measured", device, "fp32")
    listed = table_peak_tflops(device, precision)
    return Peak(listed, "table" if listed else "unknown", device, precision)


def step_model_flops(config: RoFormerConfig, micro_batches: list[tuple[int, int, int]]) -> float:
    """Model FLOPs of one optimizer step on one rank: micro_batches holds (batch size, padded length,
    masked tokens) of each micro-batch that rank ran."""
    return sum(training_flops(config, batch, length, masked) for batch, length, masked in micro_batches)


def speed_fields(flops_per_rank: float, seconds: float, peak: Peak) -> dict:
    """The train-record fields: `tflops` (model TFLOP/s per rank) and `mfu` (fraction of the peak)."""
    tflops = flops_per_rank / seconds / 1e12 if seconds > 0 else 0.0
    return {"tflops": tflops, "mfu": tflops / peak.tflops if peak.tflops else None}


__all__ = ["PEAK_TFLOPS_TABLE", "MEASURED_MFU", "ASSUMED_MFU", "PlanMfu", "plan_mfu", "Peak", "table_peak_tflops", "measure_matmul_tflops", "device_product_name",
           "resolve_peak", "step_model_flops", "speed_fields"]

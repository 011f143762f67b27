"""What `roformer gpu-check` decides and prints, without a GPU: tolerances, verdicts, the JSON report and
the console table. The GPU parts (numerics, pretraining, speed_memory) hand their measurements here.
"""
from __future__ import annotations

import platform
from dataclasses import asdict, dataclass, field

# Tolerances of part (a), as max |x - reference| / max |reference| over the compared tensor (logits; each
# parameter's gradient). Measured against fp32 references on the same GPU:
# - fp32 vs transformers: the same math in another order (SDPA vs an explicit softmax, fused vs unfused
#   RoPE); TF32 is off for matmuls by default, so differences stay at fp32 rounding over 4 layers;
# - fp16 (10-bit mantissa, ~5e-4 per rounding) and bf16 (7-bit, ~4e-3) accumulate a few roundings per
#   layer; gradients pass every layer twice, so they get twice the forward's bound.
TOLERANCES: dict[str, float] = {
    "fp32_logits": 1e-4, "fp32_grads": 1e-3,
    "fp16_logits": 1e-2, "fp16_grads": 2e-2,
    "bf16_logits": 5e-2, "bf16_grads": 1e-1,
}
# Part (d): the measured peak over `roformer plan`'s model-dependent estimate (no CUDA context, which
# max_memory_allocated does not count) must lie in this range: the estimate may err towards safety
# (FITS must not be claimed for a stage that does not fit), by at most a third.
MEMORY_RATIO_RANGE = (0.75, 1.05)
# Part (b): losses of the resumed run against the uninterrupted one. fp16 attention backward kernels
# accumulate with atomics (not bit-reproducible on a GPU), so losses agree to this relative bound while
# everything that decides the stream (learning rate, loss scale, skipped steps, masked tokens) is equal.
RESUME_LOSS_RTOL = 1e-3


@dataclass
class Check:
    """One verdict of the report."""

    part: str
    """'numerics', 'pretraining', 'speed' or 'memory'."""
    name: str
    """What was compared, e.g. 'fp16 logits vs fp32 (ours)'."""
    passed: bool | None
    """None: informational (speed) or not applicable here (bf16 on a V100)."""
    value: float | None = None
    """The measured figure (a relative difference, a ratio, tokens/s ...)."""
    limit: str = ""
    """The bound it is judged against, as printed, e.g. '<= 0.01'."""
    detail: str = ""

    @property
    def verdict(self) -> str:
        return {True: "ok", False: "FAIL", None: "-"}[self.passed]


def relative_difference(max_abs_diff: float, reference_max_abs: float) -> float:
    """max |x - ref| / max |ref| (the absolute difference when the reference is all zeros)."""
    return max_abs_diff / reference_max_abs if reference_max_abs > 0 else max_abs_diff


def tolerance_check(part: str, name: str, tolerance_key: str, max_abs_diff: float, reference_max_abs: float) -> Check:
    """A Check of one comparison against TOLERANCES[tolerance_key]; NaN or inf never pass."""
    tolerance = TOLERANCES[tolerance_key]
    difference = relative_difference(max_abs_diff, reference_max_abs)
    passed = difference == difference and difference <= tolerance  # NaN != NaN
    return Check(part, name, bool(passed), difference, f"<= {tolerance:g}", f"max abs diff {max_abs_diff:.3g}")


def memory_check(stage: str, measured_bytes: int, estimated_bytes: int) -> Check:
    """Measured peak vs the plan's estimate (MEMORY_RATIO_RANGE)."""
    low, high = MEMORY_RATIO_RANGE
    ratio = measured_bytes / estimated_bytes if estimated_bytes > 0 else float("inf")
    return Check("memory", f"peak vs plan, {stage}", low <= ratio <= high, ratio, f"{low:g}-{high:g}",
                 f"measured {measured_bytes / 2 ** 30:.2f} GiB, plan {estimated_bytes / 2 ** 30:.2f} GiB")


def resume_checks(uninterrupted: list[dict], resumed: list[dict], stop_step: int) -> list[Check]:
    """Train records (metrics.jsonl `train` rows) of the resumed run's steps after the stop against the
    same steps of the uninterrupted run: stream-deciding fields equal, loss within RESUME_LOSS_RTOL."""
    reference = {row["step"]: row for row in uninterrupted}
    after = [row for row in resumed if row["step"] > stop_step]
    missing = [row["step"] for row in after if row["step"] not in reference]
    if not after or missing:
        return [Check("pretraining", "resume: steps after the stop", False, None, "",
                      f"resumed steps {[r['step'] for r in after]} vs uninterrupted {sorted(reference)}")]
    exact = ("lr", "loss_scale", "skipped_steps", "masked_tokens", "max_seq_len")
    unequal = [f"step {row['step']} {key}" for row in after for key in exact if row[key] != reference[row["step"]][key]]
    worst = max(relative_difference(abs(row["loss"] - reference[row["step"]]["loss"]), abs(reference[row["step"]]["loss"]))
                for row in after)
    return [Check("pretraining", f"resume after step {stop_step}: {', '.join(exact)} equal", not unequal, None, "equal",
                  "; ".join(unequal[:3])),
            Check("pretraining", f"resume after step {stop_step}: losses of {len(after)} steps", worst <= RESUME_LOSS_RTOL,
                  worst, f"<= {RESUME_LOSS_RTOL:g}")]


def overflow_check(records: list[dict]) -> Check:
    """fp16 loss scaling was active: at least one step was skipped for an overflow and counted."""
    skipped = max((row["skipped_steps"] for row in records), default=0)
    scales = sorted({row["loss_scale"] for row in records})
    return Check("pretraining", "fp16 overflow step skipped and counted", skipped >= 1 and len(scales) > 1, skipped,
                 ">= 1", f"loss scales seen: {', '.join(f'{s:g}' for s in scales[:4])}")


@dataclass
class SpeedRow:
    """Part (c) at one length: both models' step time on the same batch, measured side by side."""

    seq_len: int
    batch_size: int
    precision: str
    ours_s: float
    transformers_s: float
    model_flops: float
    """Model FLOPs of one training step (roformer.flops.training_flops)."""
    peak_tflops: float | None
    """The device's table peak in this precision (launcher/common/mfu.py)."""

    def figures(self) -> dict:
        tokens = self.seq_len * self.batch_size

        def mfu(seconds: float) -> float | None:
            return self.model_flops / seconds / (self.peak_tflops * 1e12) if self.peak_tflops else None
        return {"seq_len": self.seq_len, "batch_size": self.batch_size, "precision": self.precision,
                "ours_tokens_per_s": tokens / self.ours_s, "transformers_tokens_per_s": tokens / self.transformers_s,
                "speedup": self.transformers_s / self.ours_s, "ours_mfu": mfu(self.ours_s),
                "transformers_mfu": mfu(self.transformers_s)}


@dataclass
class GpuCheckReport:
    device: dict
    """Name, compute capability, memory, count, torch / CUDA versions."""
    checks: list[Check] = field(default_factory=list)
    speed: list[SpeedRow] = field(default_factory=list)
    profile: list = field(default_factory=list)
    """Part (e): launcher/gpu_check/step_profile.StepRow per precision, length and micro-batch."""
    errors: list[str] = field(default_factory=list)
    """Parts that could not run, one line each (a failure too)."""

    @property
    def passed(self) -> bool:
        return not self.errors and all(check.passed is not False for check in self.checks)

    def to_dict(self) -> dict:
        return {"passed": self.passed, "device": self.device, "host": platform.node(),
                "tolerances": TOLERANCES, "memory_ratio_range": list(MEMORY_RATIO_RANGE),
                "resume_loss_rtol": RESUME_LOSS_RTOL,
                "checks": [{**asdict(check), "verdict": check.verdict} for check in self.checks],
                "speed": [row.figures() for row in self.speed], "profile": [asdict(row) for row in self.profile],
                "errors": self.errors}

    def table(self) -> str:
        """The console summary: one line per check, the speed rows side by side, errors last."""
        device = self.device
        lines = [f"gpu-check on {device.get('count', '?')} x {device.get('name', '?')} (compute capability "
                 f"{device.get('capability', '?')}, {device.get('memory_gib', 0):.0f} GiB; torch "
                 f"{device.get('torch', '?')}, CUDA {device.get('cuda', '?')})",
                 f"  {'part':<12}{'check':<58}{'value':>11}  {'limit':<12}verdict"]
        for check in self.checks:
            value = "" if check.value is None else f"{check.value:.3g}"
            lines.append(f"  {check.part:<12}{check.name[:57]:<58}{value:>11}  {check.limit:<12}{check.verdict}"
                         + (f"  ({check.detail})" if check.detail and check.passed is False else ""))
        if self.speed:
            lines.append(f"  {'speed':<12}{'length x batch':<16}{'ours tok/s':>12}{'hf tok/s':>12}{'speedup':>9}"
                         f"{'ours MFU':>10}{'hf MFU':>9}")
            for row in self.speed:
                f = row.figures()
                mfu = ["-" if f[k] is None else f"{100 * f[k]:.1f}%" for k in ("ours_mfu", "transformers_mfu")]
                lines.append(f"  {'':<12}{f'{row.seq_len} x {row.batch_size} {row.precision}':<16}"
                             f"{f['ours_tokens_per_s']:>12,.0f}{f['transformers_tokens_per_s']:>12,.0f}"
                             f"{f['speedup']:>8.2f}x{mfu[0]:>10}{mfu[1]:>9}")
        if self.profile:
            lines.append(f"  {'profile':<12}{'precision length x micro':<26}{'ours':>16}{'hf':>16}{'engine':>16}"
                         f"{'busy':>6}  attention")
            for row in self.profile:
                cells = [f"{row.tokens_per_s[k]:,.0f}" + (f" {100 * row.mfu[k]:.0f}%" if k in row.mfu else "")
                         for k in ("ours", "transformers", "engine")]
                lines.append(f"  {'':<12}{f'{row.precision} {row.seq_len} x {row.micro_batch}':<26}"
                             + "".join(f"{cell:>16}" for cell in cells)
                             + f"{100 * row.profile.busy_share:>5.0f}%  {row.profile.attention}")
        lines += [f"  ERROR {error}" for error in self.errors]
        lines.append(f"gpu-check: {'PASSED' if self.passed else 'FAILED'}")
        return "\n".join(lines)


def no_cuda_line(torch_version: str, cuda_build: str | None) -> str:
    """The one line `roformer gpu-check` prints (exit 2) where no CUDA device is usable."""
    build = f"a CUDA {cuda_build} build" if cuda_build else "a CPU-only build"
    return (f"roformer gpu-check: no CUDA device here (torch {torch_version}, {build}): nothing to check; run it on a "
            f"GPU machine (TORCH_VARIANT=cuda make setup installs a CUDA torch)")

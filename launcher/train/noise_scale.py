"""The gradient noise scale B_simple = tr(Sigma) / |G|^2 (McCandlish et al. 2018, "An Empirical Model of
Large-Batch Training", appendix A): the batch (in sequences) past which a bigger batch mostly buys less noise,
not faster progress, i.e. the run's critical batch.

Pure torch (and torch.distributed's default group, when one is up): no DeepSpeed, no engine. From squared
gradient norms at two batch sizes B_small < B_big,

    |G|^2     ~ (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
    tr(Sigma) ~ (|G_small|^2 - |G_big|^2) / (1 / B_small - 1 / B_big)

are unbiased; each is smoothed by its own EMA and B_simple = EMA(tr Sigma) / EMA(|G|^2) (a ratio of noisy
estimates is biased, a ratio of smoothed ones much less). The model side (which batch, which parameters):
launcher/train/noise_probe.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

EMA_DECAY = 0.9
"""Weight of the previous estimates per measurement: about the last 10 measurements count."""

BUCKET_ELEMENTS = 1 << 24
"""Gradient elements all-reduced at once (64 MiB in fp32): a big model's summed gradient is never one copy."""


@dataclass(frozen=True)
class NoiseEstimate:
    """One measurement's smoothed values (metrics.jsonl's names in `record`)."""

    noise_scale: float
    """B_simple in sequences: EMA(tr Sigma) / EMA(|G|^2)."""
    grad_sq_norm: float
    """Smoothed unbiased |G|^2 (bias-corrected EMA, as Adam's moments)."""
    noise_trace: float
    """Smoothed unbiased tr(Sigma), per sequence."""

    def record(self) -> dict:
        return {"grad_noise_scale": self.noise_scale, "grad_sq_norm": self.grad_sq_norm,
                "grad_noise_trace": self.noise_trace}


class NoiseEstimator:
    """The EMA state of the two unbiased estimates; `state_dict` is plain floats (checkpoint sidecar JSON)."""

    def __init__(self, decay: float = EMA_DECAY):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EMA decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.sq_norm = 0.0  # EMA of |G|^2, not bias-corrected
        self.trace = 0.0  # EMA of tr(Sigma)
        self.count = 0  # measurements folded in

    def update(self, small_sq: float, big_sq: float, b_small: float, b_big: float) -> NoiseEstimate | None:
        """Fold in one measurement (|G_small|^2 at batch b_small, |G_big|^2 at b_big > b_small); the smoothed
        estimate, or None while the smoothed |G|^2 is not positive (no noise scale to speak of yet)."""
        if not 0 < b_small < b_big:
            raise ValueError(f"need 0 < B_small < B_big, got {b_small}, {b_big}")
        sq_norm = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
        trace = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)
        self.sq_norm = self.decay * self.sq_norm + (1.0 - self.decay) * float(sq_norm)
        self.trace = self.decay * self.trace + (1.0 - self.decay) * float(trace)
        self.count += 1
        return self.estimate()

    def estimate(self) -> NoiseEstimate | None:
        if self.count == 0 or self.sq_norm <= 0.0:
            return None
        correction = 1.0 - self.decay ** self.count
        return NoiseEstimate(self.trace / self.sq_norm, self.sq_norm / correction, self.trace / correction)

    def state_dict(self) -> dict:
        return {"decay": self.decay, "sq_norm": self.sq_norm, "trace": self.trace, "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint's state; {} (a checkpoint from before the estimator, or of a run without it) starts afresh."""
        self.decay = float(state.get("decay", self.decay))
        self.sq_norm, self.trace = float(state.get("sq_norm", 0.0)), float(state.get("trace", 0.0))
        self.count = int(state.get("count", 0))


def squared_norms(piece_grads: list[list[torch.Tensor]]) -> tuple[float, float, int]:
    """(|G_small|^2, |G_big|^2, pieces) over all ranks: each rank gives the gradients of its `piece_grads`
    (per piece, one tensor per parameter, the same parameters in the same order on every rank, pieces of one
    size); |G_small|^2 is the mean squared norm of one piece's gradient, |G_big|^2 the squared norm of the mean
    gradient of all pieces of all ranks. Sums in fp32 (fp64 for the norms); every rank gets the same values."""
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    first = piece_grads[0]
    device = first[0].device
    # Norms per tensor in fp32 (torch's reductions sum in blocks: ~1e-7 relative), squared and summed in fp64.
    local_sq = _sum_of_squares([g.detach().float() for grads in piece_grads for g in grads])
    summed_sq = torch.zeros((), dtype=torch.float64, device=device)
    bucket: list[torch.Tensor] = []
    size = 0
    for i in range(len(first)):
        bucket.append(sum(grads[i].detach().float() for grads in piece_grads).reshape(-1))
        size += bucket[-1].numel()
        if size >= BUCKET_ELEMENTS or i == len(first) - 1:
            flat = torch.cat(bucket)
            if distributed:
                torch.distributed.all_reduce(flat)
            summed_sq += _sum_of_squares([flat])
            bucket, size = [], 0
    counts = torch.stack([local_sq, torch.tensor(float(len(piece_grads)), dtype=torch.float64, device=device)])
    if distributed:
        torch.distributed.all_reduce(counts)
    total_sq, pieces = counts.tolist()
    pieces = int(round(pieces))
    return total_sq / pieces, summed_sq.item() / pieces ** 2, pieces


def _sum_of_squares(tensors: list[torch.Tensor]) -> torch.Tensor:
    """sum |t|^2 over `tensors` (fp32 norms, fp64 sum) as a 0-d fp64 tensor on their device."""
    return torch.stack([torch.linalg.vector_norm(t) for t in tensors]).double().square().sum()

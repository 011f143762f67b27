"""Dropout for CPU training with cheap random bits: the same distribution as torch's, at a fraction of the cost.

torch's CPU dropout draws its mask with `bernoulli_` (~5-9 ns per element here); at the benchmark
shape that was ~19% of a training step. Here a mask costs one 32-bit word per element from numpy's
SFC64 generator (~0.8 ns) and one comparison, and is kept as one byte per element for backward.

Semantics are those of `F.dropout`: in training, each element is zeroed independently with
probability p (to 2**-32, finer than torch.rand's 2**-24 grid) and survivors are scaled by
1 / (1 - p); outside training, or with p == 0, nothing changes. Each call seeds a fresh SFC64 stream
from torch's default CPU generator, so `torch.manual_seed`, saved/restored RNG states and activation
checkpointing's recompute reproduce the same masks. Other devices (GPUs) keep torch's own fused dropout.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

_WORD = 2 ** 32


def new_bit_stream() -> np.random.SFC64:
    """A fresh random-bit stream seeded from torch's default CPU generator (one 63-bit draw)."""
    seed = int(torch.empty((), dtype=torch.int64).random_())
    return np.random.SFC64(seed)


def keep_mask(shape: tuple[int, ...], p: float, bits: np.random.SFC64, out: torch.Tensor | None = None
              ) -> torch.Tensor:
    """Bool tensor of `shape` (written into `out` when given), each element False (dropped)
    independently with probability p.

    Each element compares one uniform signed 32-bit word with a threshold: it is dropped when the
    word is among the lowest round(p * 2**32) of the 2**32 values.
    """
    count = 1
    for size in shape:
        count *= size
    words = torch.from_numpy(bits.random_raw((count + 1) // 2)).view(torch.int32)[:count].view(shape)
    dropped_values = min(round(p * _WORD), _WORD - 1)
    threshold = dropped_values - _WORD // 2
    return torch.ge(words, threshold) if out is None else torch.ge(words, threshold, out=out)


def use_cpu_kernels(x: torch.Tensor) -> bool:
    """The kernels of this module serve CPU tensors; other devices have fused dropout of their own."""
    return x.device.type == "cpu"


class _DropoutAdd(torch.autograd.Function):
    """residual + dropout(x) in one pass, keeping only a one-byte mask for backward."""

    @staticmethod
    def forward(ctx, residual: torch.Tensor, x: torch.Tensor, p: float) -> torch.Tensor:
        keep = keep_mask(tuple(x.shape), p, new_bit_stream()).view(torch.uint8)
        ctx.save_for_backward(keep)
        ctx.scale = 1.0 / (1.0 - p)
        if residual is None:
            return torch.mul(x, keep).mul_(ctx.scale)
        return torch.addcmul(residual, x, keep, value=ctx.scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (keep,) = ctx.saved_tensors
        grad_x = torch.mul(grad, keep).mul_(ctx.scale)
        return (grad if ctx.needs_input_grad[0] else None), grad_x, None


def dropout_add(residual: torch.Tensor | None, x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """residual + dropout(x, p) (just dropout(x, p) when residual is None), as F.dropout would compute it."""
    if not training or p == 0.0:
        return x if residual is None else residual + x
    if not use_cpu_kernels(x):
        dropped = F.dropout(x, p, training=True)
        return dropped if residual is None else residual + dropped
    return _DropoutAdd.apply(residual, x, p)


class Dropout(torch.nn.Module):
    """Drop-in for nn.Dropout with the cheap CPU mask; `forward(x, residual)` adds a residual in the same pass."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        return dropout_add(residual, x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


__all__ = ["Dropout", "dropout_add", "keep_mask", "new_bit_stream", "use_cpu_kernels"]

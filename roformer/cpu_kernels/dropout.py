"""Dropout from cheap random bits: F.dropout's distribution, with one 32-bit word per element from numpy's
SFC64 and a one-byte mask kept for backward (torch's CPU `bernoulli_` costs several times more).

Each element is zeroed independently with probability p (to 2**-32) and survivors are scaled by
1 / (1 - p). Every call seeds a fresh SFC64 stream from torch's default CPU generator, so
`torch.manual_seed`, restored RNG states and activation checkpointing's recompute give the same masks.
"""

from __future__ import annotations

import numpy as np
import torch

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


def dropout_add(residual: torch.Tensor | None, x: torch.Tensor, p: float) -> torch.Tensor:
    """residual + dropout(x, p) in training with p > 0 (just dropout(x, p) when residual is None)."""
    return _DropoutAdd.apply(residual, x, p)


__all__ = ["dropout_add", "keep_mask", "new_bit_stream"]

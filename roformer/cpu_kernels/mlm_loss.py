"""The MLM decoder and its loss in one autograd function, walking the vocabulary in cache-sized slices.

Equal to logits = F.linear(features, weight, bias), F.cross_entropy(logits.float(), targets,
reduction="sum") and (logits.argmax(-1) == targets).sum(), without writing and re-reading (M, V)
tensors. Forward computes one slice's logits, folds it into a running max/argmax and logsumexp
while it is in cache, and keeps it for backward; backward, per slice,
    G = softmax(logits)[:, slice] - onehot(targets)[:, slice]      (times the incoming loss gradient)
    dW[slice] = G^T features,  db[slice] = sum_rows G,  dfeatures += G W[slice].
"""

from __future__ import annotations

import torch

# Logits per vocabulary slice: 2**21 values (8 MiB in fp32), so that the passes over a slice hit the
# L3 cache (as attention._BLOCK_ELEMENTS).
_CHUNK_ELEMENTS = 1 << 21
# Narrowest slice: keeps the per-slice matmuls wide enough to run at speed.
_MIN_COLUMNS = 256


def _slices(vocab: int, rows: int) -> list[slice]:
    width = max(_MIN_COLUMNS, _CHUNK_ELEMENTS // max(rows, 1))
    return [slice(start, min(start + width, vocab)) for start in range(0, vocab, width)]


class _TargetsBySlice:
    """The rows whose target falls in a vocabulary slice, without scanning all rows per slice."""

    def __init__(self, targets: torch.Tensor):
        self.targets = targets
        self.order = torch.argsort(targets)
        self.sorted = targets[self.order]

    def rows(self, columns: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, their target's column inside the slice)."""
        lo, hi = torch.searchsorted(self.sorted, torch.tensor([columns.start, columns.stop])).tolist()
        rows = self.order[lo:hi]
        return rows, self.targets[rows] - columns.start


class _DecoderCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, features: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, targets: torch.Tensor):
        rows, vocab = features.shape[0], weight.shape[0]
        by_slice = _TargetsBySlice(targets)
        running_max = torch.full((rows,), -torch.inf)
        running_sum = torch.zeros(rows)  # sum of exp(logit - running_max)
        best = torch.full((rows,), -torch.inf)
        best_index = torch.zeros(rows, dtype=torch.long)
        target_logits = torch.zeros(rows)
        parts = []
        for columns in _slices(vocab, rows):
            part = torch.addmm(bias[columns], features, weight[columns].t())  # (M, slice)
            values = part.float()
            slice_max, slice_argmax = values.max(dim=-1)
            better = slice_max > best  # strict: ties keep the earlier index, as argmax does
            best = torch.where(better, slice_max, best)
            best_index = torch.where(better, slice_argmax + columns.start, best_index)
            new_max = torch.maximum(running_max, slice_max)
            running_sum = running_sum.mul_(torch.exp(running_max - new_max)).add_(
                torch.sub(values, new_max[:, None]).exp_().sum(dim=-1))
            running_max = new_max
            hit_rows, hit_columns = by_slice.rows(columns)
            target_logits[hit_rows] = values[hit_rows, hit_columns]
            parts.append(part)
        log_normalizers = running_max + running_sum.log()  # logsumexp over the whole vocabulary
        loss_sum = (log_normalizers - target_logits).sum()
        correct = (best_index == targets).sum()
        ctx.save_for_backward(features, weight, targets, log_normalizers, *parts)
        ctx.mark_non_differentiable(correct)
        ctx.set_materialize_grads(False)  # unread logits get None, not zeros
        ctx.bias_dtype = bias.dtype
        return (loss_sum, correct, *parts)

    @staticmethod
    def backward(ctx, grad_loss, _grad_correct, *grad_parts):
        features, weight, targets, log_normalizers, *parts = ctx.saved_tensors
        rows, vocab = features.shape[0], weight.shape[0]
        by_slice = _TargetsBySlice(targets)
        grad_features = torch.zeros_like(features, dtype=torch.float32)  # accumulated over slices
        grad_weight = torch.empty_like(weight)
        grad_bias = torch.empty(vocab, dtype=torch.float32)
        for columns, part, grad_part in zip(_slices(vocab, rows), parts, grad_parts):
            if grad_loss is None and grad_part is None:  # neither the loss nor these logits were used
                grad_weight[columns] = 0
                grad_bias[columns] = 0
                continue
            if grad_loss is None:
                grad = grad_part.float()
            else:
                grad = torch.sub(part.float(), log_normalizers[:, None]).exp_().mul_(grad_loss)  # softmax
                hit_rows, hit_columns = by_slice.rows(columns)
                grad[hit_rows, hit_columns] -= grad_loss  # - onehot
                if grad_part is not None:
                    grad += grad_part
            torch.sum(grad, dim=0, out=grad_bias[columns])
            torch.mm(grad.t().to(weight.dtype), features, out=grad_weight[columns])
            # out= rather than addmm_: the same kernel, and torch's FlopCounterMode counts it
            torch.addmm(grad_features, grad, weight[columns].float(), out=grad_features)  # float(): free for fp32
        return grad_features.to(features.dtype), grad_weight, grad_bias.to(ctx.bias_dtype), None


def decoder_cross_entropy(features: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, targets: torch.Tensor
                          ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor]:
    """features (M, E), weight (V, E), bias (V,), targets (M,) -> (logit slices, fp32 loss sum, long hit count)."""
    loss_sum, correct, *parts = _DecoderCrossEntropy.apply(features, weight, bias, targets)
    return tuple(parts), loss_sum, correct


__all__ = ["decoder_cross_entropy"]

"""Summed cross-entropy and top-1 hits of the masked tokens' (M, V) logits, in cache-sized row chunks.

Equal to `F.cross_entropy(logits.float(), targets, reduction="sum")` and
`(logits.argmax(-1) == targets).sum()`, but cheaper on the wide vocabulary rows: log_softmax would
write an (M, V) log-probability tensor, its backward an (M, V) zero-filled gradient plus another
(M, V) result, and argmax would read the logits once more. Here forward reads each chunk of rows
while it is in cache (max + argmax, then logsumexp) and keeps only the (M,) log-normalisers; backward
writes the gradient softmax(logits) - onehot(targets), times the incoming scale, once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .dropout import use_cpu_kernels

# Logits per chunk: 2**20 values (4 MiB in fp32), so that the passes over one chunk hit the cache.
_CHUNK_ELEMENTS = 1 << 20


def _row_chunks(rows: int, width: int):
    step = max(1, _CHUNK_ELEMENTS // max(width, 1))
    for start in range(0, rows, step):
        yield slice(start, min(start + step, rows))


class _SummedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor):
        rows, width = logits.shape
        log_normalizers = torch.empty(rows, dtype=torch.float32, device=logits.device)
        correct = torch.zeros((), dtype=torch.long, device=logits.device)
        for chunk in _row_chunks(rows, width):
            values = logits[chunk].float()
            correct += (values.argmax(dim=-1) == targets[chunk]).sum()
            torch.logsumexp(values, dim=-1, out=log_normalizers[chunk])
        target_logits = logits.gather(1, targets[:, None]).squeeze(1).float()  # (M,)
        loss_sum = (log_normalizers - target_logits).sum()
        ctx.save_for_backward(logits, log_normalizers, targets)
        ctx.mark_non_differentiable(correct)
        return loss_sum, correct

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, _grad_correct):
        logits, log_normalizers, targets = ctx.saved_tensors
        rows, width = logits.shape
        grad = torch.empty_like(logits)
        for chunk in _row_chunks(rows, width):
            if grad.dtype == torch.float32:
                torch.sub(logits[chunk], log_normalizers[chunk, None], out=grad[chunk]).exp_().mul_(grad_loss)
            else:  # softmax in float32, stored in the logits' dtype
                grad[chunk] = torch.sub(logits[chunk].float(), log_normalizers[chunk, None]).exp_().mul_(grad_loss)
        grad[torch.arange(rows, device=logits.device), targets] -= grad_loss.to(grad.dtype)  # - onehot
        return grad, None


def summed_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp32 sum of token cross-entropies, long count of argmax == target) for logits (M, V), targets (M,).

    The chunked form serves CPU tensors; on GPUs torch's fused cross-entropy kernels are used (a
    Python loop over chunks would cost a kernel launch per chunk there).
    """
    if use_cpu_kernels(logits):
        return _SummedCrossEntropy.apply(logits, targets)
    loss_sum = F.cross_entropy(logits.float(), targets, reduction="sum")
    return loss_sum, (logits.argmax(dim=-1) == targets).sum()


__all__ = ["summed_cross_entropy"]

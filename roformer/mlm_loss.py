"""The MLM decoder and its loss at the masked tokens: logits (M, V), summed cross-entropy, top-1 hits.

On CPU one autograd function does decoder + loss, equal to
    logits = F.linear(features, weight, bias)
    loss_sum = F.cross_entropy(logits.float(), targets, reduction="sum")
    num_correct = (logits.argmax(-1) == targets).sum()
but without the (M, V)-sized work around the two matmuls that the separate ops do: addmm's bias
pre-fill of the output, log_softmax's (M, V) log-probabilities and its backward's zero-filled and
result (M, V) tensors (each a fresh mmap that is page-faulted in: ~0.4 ms per MB here), argmax's
extra read. Forward adds the bias and reads each cache-sized row chunk for max/argmax and
logsumexp, keeping only the (M,) log-normalisers. Backward walks the vocabulary in column chunks:
    G_c = softmax(logits)[:, c] - onehot(targets)[:, c]      (times the incoming loss gradient)
    dW_c = G_c^T features,  db_c = sum_rows G_c,  dfeatures += G_c W_c
so the (M, V) gradient only ever exists one cache-sized chunk at a time.
Elsewhere (GPUs) the separate torch ops are used: their fused kernels need no chunking.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .dropout import use_cpu_kernels

# Logits per chunk: 2**21 values (8 MiB in fp32), so that the passes over one chunk hit the L3 cache
# (same trade-off as cpu_attention._BLOCK_ELEMENTS).
_CHUNK_ELEMENTS = 1 << 21
# Narrowest vocabulary chunk in backward: keeps the per-chunk matmuls wide enough to run at speed.
_MIN_COLUMNS = 256


def _chunks(length: int, step: int):
    for start in range(0, length, step):
        yield slice(start, min(start + step, length))


class _DecoderCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, features: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, targets: torch.Tensor):
        rows, vocab = features.shape[0], weight.shape[0]
        logits = torch.mm(features, weight.t())  # (M, V); bias added per chunk below, in cache
        log_normalizers = torch.empty(rows, dtype=torch.float32)
        correct = torch.zeros((), dtype=torch.long)
        for chunk in _chunks(rows, max(1, _CHUNK_ELEMENTS // max(vocab, 1))):
            block = logits[chunk].add_(bias)
            values = block.float()
            correct += (values.argmax(dim=-1) == targets[chunk]).sum()
            torch.logsumexp(values, dim=-1, out=log_normalizers[chunk])
        target_logits = logits.gather(1, targets[:, None]).squeeze(1).float()  # (M,)
        loss_sum = (log_normalizers - target_logits).sum()
        ctx.save_for_backward(features, weight, logits, log_normalizers, targets)
        ctx.mark_non_differentiable(correct)
        ctx.set_materialize_grads(False)  # unused logits get None, not an (M, V) tensor of zeros
        ctx.bias_dtype = bias.dtype
        return logits, loss_sum, correct

    @staticmethod
    def backward(ctx, grad_logits, grad_loss, _grad_correct):
        features, weight, logits, log_normalizers, targets = ctx.saved_tensors
        rows, vocab = logits.shape
        grad_features = torch.zeros_like(features, dtype=torch.float32)  # accumulated over chunks
        grad_weight = torch.empty_like(weight)
        grad_bias = torch.empty(vocab, dtype=torch.float32)
        order = torch.argsort(targets)  # rows by target, to find each column chunk's targets
        sorted_targets = targets[order]
        columns = max(_MIN_COLUMNS, _CHUNK_ELEMENTS // max(rows, 1))
        for chunk in _chunks(vocab, columns):
            if grad_loss is None:  # only the logits were differentiated
                grad = grad_logits[:, chunk].float()
            else:
                grad = torch.sub(logits[:, chunk].float(), log_normalizers[:, None]).exp_().mul_(grad_loss)  # softmax
                lo, hi = torch.searchsorted(sorted_targets, torch.tensor([chunk.start, chunk.stop])).tolist()
                hit_rows = order[lo:hi]
                grad[hit_rows, targets[hit_rows] - chunk.start] -= grad_loss  # - onehot
                if grad_logits is not None:
                    grad += grad_logits[:, chunk]
            torch.sum(grad, dim=0, out=grad_bias[chunk])
            torch.mm(grad.t().to(weight.dtype), features, out=grad_weight[chunk])
            # out= rather than addmm_: the same kernel, and torch's FlopCounterMode counts it
            torch.addmm(grad_features, grad, weight[chunk].float(), out=grad_features)  # float(): free for fp32
        return grad_features.to(features.dtype), grad_weight, grad_bias.to(ctx.bias_dtype), None


def decoder_cross_entropy(features: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, targets: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """features (M, E), tied decoder weight (V, E), bias (V,), targets (M,) ->
    (logits (M, V), fp32 sum of token cross-entropies, long count of argmax == target)."""
    if use_cpu_kernels(features):
        return _DecoderCrossEntropy.apply(features, weight, bias, targets)
    logits = F.linear(features, weight, bias)
    loss_sum = F.cross_entropy(logits.float(), targets, reduction="sum")
    return logits, loss_sum, (logits.argmax(dim=-1) == targets).sum()


__all__ = ["decoder_cross_entropy"]

"""Softmax attention with dropout on the probabilities, computed block by block (SDPA's semantics).

The (B*H) x T query rows are cut into blocks of about `_BLOCK_ELEMENTS` scores, so that a block's
scores, probabilities and mask stay in cache. Forward, per block: P = softmax(scale * q k^T + bias),
a keep mask (`dropout.keep_mask`) and out = (P * keep) v / (1 - p). Only the one-byte mask is stored;
backward recomputes P from q and k and applies, with K = P * keep,
    dV = K^T dO / (1 - p)
    P * dP = (dO V^T) * K / (1 - p)
    dS = P * dP - P * rowsum(P * dP)
    dQ = scale * dS K,   dK = scale * dS^T q.
Half-precision inputs are computed in float32 and cast back.
"""

from __future__ import annotations

import numpy as np
import torch

from .dropout import keep_mask, new_bit_stream

# Scores per block: 2**21 fp32 values = 8 MiB, so that a block's three (G, T, Tk) temporaries in
# backward stay in the 32 MiB L3 (the sizes measured are in docs/model.md).
_BLOCK_ELEMENTS = 1 << 21
# Per-document blocks pay off when they hold at most this share of the dense scores: their many small
# matmuls each end in a thread barrier (bench/results/documents.json: ~2 documents per 128-token row ran
# slower per document than dense with a bias, ~5.5 per 512-token row faster).
_DOCUMENT_SHARE = 1 / 3


def _blocks(batch_heads: int, query_len: int, key_len: int):
    """(head slice, query-row slice) pairs covering all rows with about _BLOCK_ELEMENTS scores each."""
    rows = max(1, _BLOCK_ELEMENTS // key_len)
    if rows >= query_len:  # whole heads per block
        heads = rows // query_len
        for start in range(0, batch_heads, heads):
            yield slice(start, min(start + heads, batch_heads)), slice(0, query_len)
    else:  # long sequences: part of one head's query rows per block
        for head in range(batch_heads):
            for start in range(0, query_len, rows):
                yield slice(head, head + 1), slice(start, min(start + rows, query_len))


def _block_bias(bias: torch.Tensor | None, heads: int, hs: slice, rs: slice) -> torch.Tensor | None:
    """The additive bias of one block: bias (B, 1, 1 or T, Tk) -> (G, 1 or rows, Tk) for its heads hs
    (of the B*H flattened) and query rows rs; None stays None."""
    if bias is None:
        return None
    per_head = bias[torch.arange(hs.start, hs.stop) // heads, 0]  # (G, 1 or T, Tk)
    return per_head if per_head.shape[1] == 1 else per_head[:, rs]


def _probabilities(query: torch.Tensor, key_t: torch.Tensor, bias: torch.Tensor | None, scale: float) -> torch.Tensor:
    """softmax(scale * query key_t + bias) for one block; key_t is (G, D, Tk)."""
    if bias is None:  # beta=0: the uninitialised input is ignored, the scale rides on the matmul
        scores = torch.baddbmm(query.new_empty(()).expand(query.shape[0], query.shape[1], key_t.shape[2]),
                               query, key_t, beta=0.0, alpha=scale)
    else:
        scores = torch.baddbmm(bias, query, key_t, alpha=scale)
    return scores.softmax(dim=-1)


class _DropoutAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, bias, p: float):
        batch, heads, query_len, head_size = query.shape
        key_len, value_size = key.shape[2], value.shape[3]
        dtype = query.dtype
        scale = head_size ** -0.5
        # (B*H, T, D) float32 views or copies (the projections arrive as (B, T, H, D) transposed).
        q = query.float().reshape(batch * heads, query_len, head_size)
        k = key.float().reshape(batch * heads, key_len, head_size)
        v = value.float().reshape(batch * heads, key_len, value_size)
        # (B, 1, 1, Tk) additive padding bias or (B, 1, T, Tk) document bias; each block takes its rows.
        b = None if bias is None else bias.float()
        keep = torch.empty(batch * heads, query_len, key_len, dtype=torch.bool)
        out = torch.empty(batch * heads, query_len, value_size)
        bits = new_bit_stream()
        for hs, rs in _blocks(batch * heads, query_len, key_len):
            probs = _probabilities(q[hs, rs], k[hs].transpose(1, 2), _block_bias(b, heads, hs, rs), scale)
            block_keep = keep_mask(tuple(probs.shape), p, bits, out=keep[hs, rs])
            torch.bmm(probs.mul_(block_keep.view(torch.uint8)), v[hs], out=out[hs, rs])
        out.mul_(1.0 / (1.0 - p))
        ctx.save_for_backward(q, k, v, b, keep)
        ctx.p, ctx.scale, ctx.dtype, ctx.batch_heads = p, scale, dtype, (batch, heads)
        return out.view(batch, heads, query_len, value_size).to(dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, b, keep = ctx.saved_tensors
        batch_heads, query_len, head_size = q.shape
        key_len, value_size = v.shape[1], v.shape[2]
        grad_out = grad_out.float().reshape(batch_heads, query_len, value_size)  # (B*H, T, Dv)
        grad_q = torch.empty_like(q)
        whole_heads = max(1, _BLOCK_ELEMENTS // key_len) >= query_len
        # With whole heads per block each block writes its own dK/dV rows; split heads accumulate.
        grad_k = torch.empty_like(k) if whole_heads else torch.zeros_like(k)
        grad_v = torch.empty_like(v) if whole_heads else torch.zeros_like(v)
        for hs, rs in _blocks(batch_heads, query_len, key_len):
            probs = _probabilities(q[hs, rs], k[hs].transpose(1, 2), _block_bias(b, ctx.batch_heads[1], hs, rs),
                                   ctx.scale)
            kept = torch.mul(probs, keep[hs, rs].view(torch.uint8))  # P * keep
            do = grad_out[hs, rs]
            # t = P * dP * (1 - p) = (dO V^T) * P * keep;  dS * (1 - p) = t - P * rowsum(t)
            t = torch.bmm(do, v[hs].transpose(1, 2)).mul_(kept)
            grad_s = t.addcmul_(probs, t.sum(dim=-1, keepdim=True), value=-1.0)
            torch.bmm(grad_s, k[hs], out=grad_q[hs, rs])
            if whole_heads:
                torch.bmm(kept.transpose(1, 2), do, out=grad_v[hs])
                torch.bmm(grad_s.transpose(1, 2), q[hs, rs], out=grad_k[hs])
            else:
                grad_v[hs].baddbmm_(kept.transpose(1, 2), do)
                grad_k[hs].baddbmm_(grad_s.transpose(1, 2), q[hs, rs])
        inverse_keep = 1.0 / (1.0 - ctx.p)
        grad_q.mul_(inverse_keep * ctx.scale)  # scores = scale * q k^T
        grad_k.mul_(inverse_keep * ctx.scale)
        grad_v.mul_(inverse_keep)
        batch, heads = ctx.batch_heads
        grad_q = grad_q.view(batch, heads, query_len, head_size).to(ctx.dtype)
        grad_k = grad_k.view(batch, heads, key_len, head_size).to(ctx.dtype)
        grad_v = grad_v.view(batch, heads, key_len, value_size).to(ctx.dtype)
        return grad_q, grad_k, grad_v, None, None


def document_spans(bias: torch.Tensor) -> list[tuple[int, int, int]]:
    """(row, start, stop) of the documents of a block-diagonal (B, 1, T, T) document bias
    (`roformer.attention.document_mask`): a span ends where a token may not see the one before it. A query
    that sees no key at all (padding) is a span of its own."""
    may_see_previous = bias[:, 0].diagonal(offset=-1, dim1=1, dim2=2) == 0  # (B, T-1)
    length = bias.shape[-1]
    spans = []
    for row, joined in enumerate(may_see_previous.numpy()):
        cuts = [0, *(np.flatnonzero(~joined) + 1).tolist(), length]
        spans.extend((row, start, stop) for start, stop in zip(cuts[:-1], cuts[1:]))
    return spans


class _DocumentDropoutAttention(torch.autograd.Function):
    """_DropoutAttention over each document alone: a (H, L, L) block per document, none across documents,
    so the work falls with the documents' lengths (sum of L^2 instead of T^2). Backward as above, per span;
    every position is in one span, so each span writes its own rows of dQ, dK and dV."""

    @staticmethod
    def forward(ctx, query, key, value, spans, p: float):
        dtype, scale = query.dtype, query.shape[-1] ** -0.5
        q, k, v = query.float(), key.float(), value.float()  # (B, H, T, D)
        out = torch.empty(*q.shape[:3], v.shape[-1])
        keeps, bits = [], new_bit_stream()
        for row, start, stop in spans:
            probs = _probabilities(q[row, :, start:stop], k[row, :, start:stop].transpose(1, 2), None, scale)
            keep = keep_mask(tuple(probs.shape), p, bits)
            out[row, :, start:stop] = torch.bmm(probs.mul_(keep.view(torch.uint8)), v[row, :, start:stop])
            keeps.append(keep)
        out.mul_(1.0 / (1.0 - p))
        ctx.save_for_backward(q, k, v, *keeps)
        ctx.spans, ctx.p, ctx.scale, ctx.dtype = spans, p, scale, dtype
        return out.to(dtype)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, *keeps = ctx.saved_tensors
        grad_out = grad_out.float()
        grad_q, grad_k, grad_v = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        for (row, start, stop), keep in zip(ctx.spans, keeps):
            qs, ks, vs = q[row, :, start:stop], k[row, :, start:stop], v[row, :, start:stop]
            probs = _probabilities(qs, ks.transpose(1, 2), None, ctx.scale)
            kept = torch.mul(probs, keep.view(torch.uint8))
            do = grad_out[row, :, start:stop]
            t = torch.bmm(do, vs.transpose(1, 2)).mul_(kept)
            grad_s = t.addcmul_(probs, t.sum(dim=-1, keepdim=True), value=-1.0)
            grad_q[row, :, start:stop] = torch.bmm(grad_s, ks)
            grad_k[row, :, start:stop] = torch.bmm(grad_s.transpose(1, 2), qs)
            grad_v[row, :, start:stop] = torch.bmm(kept.transpose(1, 2), do)
        inverse_keep = 1.0 / (1.0 - ctx.p)
        grad_q.mul_(inverse_keep * ctx.scale)
        grad_k.mul_(inverse_keep * ctx.scale)
        grad_v.mul_(inverse_keep)
        return grad_q.to(ctx.dtype), grad_k.to(ctx.dtype), grad_v.to(ctx.dtype), None, None


def dropout_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor | None,
                      p: float) -> torch.Tensor:
    """SDPA with dropout_p=p in training: query/key/value (B, H, T, D), bias (B, 1, 1 or T, Tk) additive or None.

    A (B, 1, T, T) document bias runs each document alone (no block across documents) while its longest
    document's block fits _BLOCK_ELEMENTS and the documents' blocks hold at most _DOCUMENT_SHARE of the
    dense scores; a query that sees no key (padding) then attends to itself alone,
    where SDPA spreads it over all keys (a row nothing reads: padding is never scored nor seen)."""
    if bias is not None and bias.shape[2] > 1:
        spans = document_spans(bias)
        lengths = [stop - start for _, start, stop in spans]
        if query.shape[1] * max(lengths) ** 2 <= _BLOCK_ELEMENTS and \
                sum(n * n for n in lengths) <= _DOCUMENT_SHARE * bias.shape[0] * bias.shape[-1] ** 2:
            return _DocumentDropoutAttention.apply(query, key, value, spans, p)
    return _DropoutAttention.apply(query, key, value, bias, p)


__all__ = ["dropout_attention"]

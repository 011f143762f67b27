"""The CPU training kernels behind one switch, `use_cpu_kernels(tensor)`.

Each function here is one op of the model: a CPU tensor takes this package's kernel, any other device
the plain torch op (GPUs have fused kernels of their own), and so does code that torch.compile traces.
What each kernel does and why: docs/model.md.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from . import attention, dropout, ffn, mlm_loss


def use_cpu_kernels(x: torch.Tensor) -> bool:
    """The one switch: whether x's op runs the CPU kernel of this package. Not while torch.compile traces
    (run config `model.compile`): the compiler fuses the plain ops itself, and the kernels' custom autograd
    functions and data-dependent shapes would break its graph."""
    return x.device.type == "cpu" and not torch.compiler.is_compiling()


def dropout_add(residual: torch.Tensor | None, x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """residual + dropout(x, p) (just dropout(x, p) when residual is None), as F.dropout would compute it."""
    if not training or p == 0.0:
        return x if residual is None else residual + x
    if use_cpu_kernels(x):
        return dropout.dropout_add(residual, x, p)
    dropped = F.dropout(x, p, training=True)
    return dropped if residual is None else residual + dropped


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 mask: torch.Tensor | None, dropout_p: float) -> torch.Tensor:
    """F.scaled_dot_product_attention: query/key/value (B, H, T, D), additive mask (B, 1, 1, T),
    (B, 1, T, T) or None.

    CPU SDPA has no fused kernel with dropout (its math path keeps several (B, H, T, T) tensors).
    """
    if dropout_p > 0.0 and use_cpu_kernels(query):
        return attention.dropout_attention(query, key, value, mask, dropout_p)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout_p)


def feed_forward(hidden: torch.Tensor, ffn_in: nn.Linear, activation: Callable[[torch.Tensor], torch.Tensor],
                 ffn_out: nn.Linear) -> torch.Tensor:
    """ffn_out(activation(ffn_in(hidden))); on CPU in token chunks that fit glibc's heap."""
    if use_cpu_kernels(hidden):
        return ffn.chunked_feed_forward(hidden, ffn_in, activation, ffn_out)
    return ffn_out(activation(ffn_in(hidden)))


def decoder_cross_entropy(features: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, targets: torch.Tensor
                          ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor]:
    """features (M, E), tied decoder weight (V, E), bias (V,), targets (M,) ->
    (vocabulary slices of the logits (M, V), fp32 sum of token cross-entropies, long count of argmax == target).

    torch.cat(slices, dim=-1) are the logits; off the CPU there is one slice, and rows whose target is
    -100 (padding slots of the masked positions) count for nothing; the CPU kernel takes only scored rows
    (`drop_unscored_rows`).
    """
    if use_cpu_kernels(features):
        return mlm_loss.decoder_cross_entropy(features, weight, bias, targets)
    logits = F.linear(features, weight, bias)
    loss_sum = F.cross_entropy(logits.float(), targets, reduction="sum", ignore_index=-100)
    return (logits,), loss_sum, (logits.argmax(dim=-1) == targets).sum()


def drop_padding_free_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """None for an all-ones (B, T) mask on CPU, so that attention needs no bias pass; elsewhere the mask
    as it is (reading the flag on a GPU would be a host sync per step)."""
    if attention_mask is not None and use_cpu_kernels(attention_mask) and bool(attention_mask.all()):
        return None
    return attention_mask


def drop_unscored_rows(rows: torch.Tensor, targets: torch.Tensor, ignore_index: int
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """rows (N, H), targets (N,) -> on CPU only the rows whose target is not ignore_index (the head and the
    CPU loss then skip the padding slots); elsewhere all of them (a count read off the targets would
    make the host wait for the device, and the shapes would change from batch to batch)."""
    if use_cpu_kernels(targets):
        scored = targets != ignore_index
        return rows[scored], targets[scored]
    return rows, targets


def drop_single_document(document_ids: torch.Tensor | None) -> torch.Tensor | None:
    """None on CPU when every row is one document (attention is then exactly the sequence's, without a
    mask pass); elsewhere the ids as they are (reading the flag on a GPU would be a host sync)."""
    if document_ids is not None and use_cpu_kernels(document_ids) and bool((document_ids == document_ids[:, :1]).all()):
        return None
    return document_ids


__all__ = ["use_cpu_kernels", "dropout_add", "scaled_dot_product_attention", "feed_forward",
           "decoder_cross_entropy", "drop_padding_free_mask", "drop_unscored_rows", "drop_single_document"]

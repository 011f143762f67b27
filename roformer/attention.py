"""Multi-head self-attention with RoPE: softmax (SDPA, or FlashAttention's variable-length kernel over packed
documents) and the paper's linear attention (eq. 19)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import RoFormerConfig
from .cpu_kernels import scaled_dot_product_attention
from .rope import apply_rotary

# Keeps the linear-attention denominator away from zero when every key of a row is padding.
_LINEAR_ATTENTION_EPS = 1e-6


def additive_padding_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, T) with 1 = real token -> (B, 1, 1, T) additive mask: 0 for real keys, dtype-min for padding;
    a (B, 1, T, T) boolean key mask per query (`document_mask`) -> (B, 1, T, T) the same way.

    An additive mask (as transformers) rather than a boolean one keeps a fully padded row finite.
    """
    keep = (attention_mask[:, None, None, :] if attention_mask.dim() == 2 else attention_mask).to(torch.bool)
    return torch.zeros(keep.shape, dtype=dtype, device=attention_mask.device).masked_fill(
        ~keep, torch.finfo(dtype).min)


def document_mask(document_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """(B, T) document ids (and the (B, T) padding mask, 1 = real) -> (B, 1, T, T) bool: query t may
    see key s when both are in the same document and s is a real token. Static shape, no host sync."""
    keep = document_ids[:, :, None] == document_ids[:, None, :]  # (B, T, T)
    if attention_mask is not None:
        keep = keep & attention_mask[:, None, :].to(torch.bool)
    return keep[:, None]  # (B, 1, T, T)


def varlen_usable(query: torch.Tensor, dropout_p: float) -> bool:
    """Whether FlashAttention's variable-length kernel can run this attention: a CUDA tensor in fp16/bf16, head
    size <= 256, and no attention dropout (torch's `varlen_attn` has none)."""
    return query.is_cuda and query.dtype in (torch.float16, torch.bfloat16) and query.shape[-1] <= 256 and not dropout_p


def flatten_tokens(x: torch.Tensor) -> torch.Tensor:
    """(B, H, T, D) -> (B*T, H, D): the batch's rows one after another, varlen's token layout."""
    batch, heads, length, size = x.shape
    return x.transpose(1, 2).reshape(batch * length, heads, size)


def unflatten_tokens(x: torch.Tensor, batch: int) -> torch.Tensor:
    """(B*T, H, D) -> (B, H, T, D), the inverse of flatten_tokens."""
    tokens, heads, size = x.shape
    return x.view(batch, tokens // batch, heads, size).transpose(1, 2)


def document_varlen_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                              cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Softmax attention inside each document, as one variable-length FlashAttention call over the flattened batch
    (no (B, 1, T, T) mask, no padded document). query/key/value (B, H, T, D); cu_seqlens (N+1,) int32: offsets of the
    batch's N documents (padding's runs included) in its B*T tokens (data_pipeline.documents.document_offsets).
    The longest document is given as T, an upper bound known without reading the device (and no compiled graph per longest length)."""
    # Imported here, where CUDA runs it: importing torch.nn.attention.varlen loads torch._dynamo (2.4 s on a CPU),
    # which every model import (export, eval, fine-tuning on the CPU) would otherwise pay.
    from torch.nn.attention.varlen import varlen_attn

    batch, _, length, _ = query.shape
    context = varlen_attn(flatten_tokens(query), flatten_tokens(key), flatten_tokens(value), cu_seqlens, cu_seqlens,
                          length, length)  # (B*T, H, D)
    return unflatten_tokens(context, batch)  # (B, H, T, D)


def feature_map(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = elu(x) + 1: positive features, as in Katharopoulos et al. and the paper."""
    return F.elu(x) + 1.0


def linear_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cos: torch.Tensor | None,
                     sin: torch.Tensor | None, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Eq. 19 in O(N): out_m = sum_n (R_m phi(q_m))^T (R_n phi(k_n)) v_n / sum_n phi(q_m)^T phi(k_n).

    query, key, value: (B, H, T, D); cos/sin: (T, D) or None (no rotation); attention_mask (B, T).
    The rotation is applied after the feature map and only in the numerator; the denominator stays
    unrotated so it remains positive. Computed in float32: it sums over the whole sequence.
    """
    dtype = value.dtype
    phi_q, phi_k, value = feature_map(query.float()), feature_map(key.float()), value.float()
    if attention_mask is not None:
        keep = attention_mask[:, None, :, None].to(phi_k.dtype)  # (B, 1, T, 1)
        phi_k = phi_k * keep  # padded keys contribute to neither sum
        value = value * keep
    if cos is not None:
        rotated_q, rotated_k = apply_rotary(phi_q, cos, sin), apply_rotary(phi_k, cos, sin)
    else:
        rotated_q, rotated_k = phi_q, phi_k
    key_value = torch.einsum("bhnd,bhne->bhde", rotated_k, value)  # (B, H, D, Dv)
    numerator = torch.einsum("bhmd,bhde->bhme", rotated_q, key_value)  # (B, H, T, Dv)
    key_sum = phi_k.sum(dim=2)  # (B, H, D)
    denominator = torch.einsum("bhmd,bhd->bhm", phi_q, key_sum).clamp_min(_LINEAR_ATTENTION_EPS)  # (B, H, T)
    return (numerator / denominator[..., None]).to(dtype)


class SelfAttention(nn.Module):
    """q/k/v projections, RoPE, attention, output projection (the residual + LayerNorm is the block's)."""

    def __init__(self, config: RoFormerConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_size = config.head_size
        self.rotary_value = config.rotary_value
        self.kind = config.attention
        self.dropout_prob = config.attention_probs_dropout_prob
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.output = nn.Linear(config.hidden_size, config.hidden_size)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.head_size).transpose(1, 2)  # (B, H, T, D)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None,
                rotary: tuple[torch.Tensor, torch.Tensor] | None, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """hidden (B, T, hidden); attention_mask (B, T) 1 = real, or a (B, 1, T, T) `document_mask`, or None;
        rotary = (cos, sin) each (T, D) or (B, 1, T, D) (positions per token), or None; cu_seqlens: the documents'
        offsets (document_varlen_attention), used instead of the document mask where `varlen_usable`."""
        query = self._split_heads(self.query(hidden))  # (B, H, T, D)
        key = self._split_heads(self.key(hidden))
        value = self._split_heads(self.value(hidden))

        if self.kind == "linear":
            if attention_mask is not None and attention_mask.dim() != 2:
                raise ValueError("document_ids: linear attention sums over the whole sequence; document "
                                 "attention needs model.attention 'softmax'")
            cos, sin = rotary if rotary is not None else (None, None)
            if self.rotary_value and rotary is not None:
                value = apply_rotary(value, cos, sin)
            context = linear_attention(query, key, value, cos, sin, attention_mask)  # (B, H, T, D)
        else:
            if rotary is not None:
                cos, sin = rotary
                query, key = apply_rotary(query, cos, sin), apply_rotary(key, cos, sin)
                if self.rotary_value:
                    value = apply_rotary(value, cos, sin)
            dropout_p = self.dropout_prob if self.training else 0.0
            if cu_seqlens is not None and varlen_usable(query, dropout_p):
                context = document_varlen_attention(query, key, value, cu_seqlens)  # (B, H, T, D)
            else:
                # (B, 1, 1, T) or (B, 1, T, T) additive, or None
                mask = None if attention_mask is None else additive_padding_mask(attention_mask, query.dtype)
                context = scaled_dot_product_attention(query, key, value, mask, dropout_p)  # (B, H, T, D)

        batch, _, length, _ = context.shape
        context = context.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_size)  # (B, T, hidden)
        return self.output(context)


__all__ = ["SelfAttention", "linear_attention", "feature_map", "additive_padding_mask", "document_mask",
           "document_varlen_attention", "varlen_usable", "flatten_tokens", "unflatten_tokens"]

"""The feed-forward in token chunks, so that its (rows, intermediate) activations come from the heap."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

# Largest (rows, intermediate) activation allocated at once: half of glibc's 32 MiB ceiling for serving
# freed memory from the heap; larger blocks are fresh mmaps, page-faulted in on every use.
_FFN_CHUNK_BYTES = 16 << 20


def chunked_feed_forward(hidden: torch.Tensor, ffn_in: nn.Linear, activation: Callable[[torch.Tensor], torch.Tensor],
                         ffn_out: nn.Linear) -> torch.Tensor:
    """ffn_out(activation(ffn_in(hidden))) for hidden (B, T, H), in chunks of rows under _FFN_CHUNK_BYTES."""
    flat = hidden.reshape(-1, hidden.shape[-1])  # (B*T, H)
    row_bytes = ffn_in.out_features * hidden.element_size()
    rows = max(1, _FFN_CHUNK_BYTES // row_bytes)
    if flat.shape[0] <= rows:
        return ffn_out(activation(ffn_in(hidden)))
    parts = [ffn_out(activation(ffn_in(part))) for part in flat.split(rows)]  # each (rows, H)
    return torch.cat(parts).view(hidden.shape)


__all__ = ["chunked_feed_forward"]

"""How a packed sequence's documents reach the model: who attends to whom, where positions start.

A packed sequence is [CLS] + pieces of documents joined by [SEP] (stream.py). Its `document_ids` (B, T)
count the [SEP]s before each token: [CLS] joins the first document, a [SEP] the document it closes,
padding gets a document of its own. No shard format holds them: they are read off the [SEP]s.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from data_pipeline.errors import DataError

DOCUMENT_VIEWS = ("sequence", "document")


@dataclass(frozen=True)
class DocumentView:
    """What a batch carries about its documents (run config `data.attention`, `data.positions`)."""

    attention: str = "sequence"
    """'sequence': every token attends to the whole packed sequence (BERT's FULL-SENTENCES; the batch has no
    document_ids); 'document': only to its own document (the batch carries `document_ids`)."""
    positions: str = "sequence"
    """'sequence': positions count from the [CLS]; 'document': they restart at each document's first
    token (the batch carries `position_ids`)."""

    def __post_init__(self) -> None:
        for name in ("attention", "positions"):
            if getattr(self, name) not in DOCUMENT_VIEWS:
                raise DataError(f"data.{name}: {getattr(self, name)!r} is not one of {', '.join(DOCUMENT_VIEWS)}")


def run_starts(values: np.ndarray) -> np.ndarray:
    """(B, T) -> (B, T) bool: True where a row's run of equal values begins (each row's first token included)."""
    starts = np.ones(values.shape, dtype=bool)
    starts[:, 1:] = values[:, 1:] != values[:, :-1]
    return starts


def document_positions(document_ids: np.ndarray) -> np.ndarray:
    """(B, T) document ids -> (B, T) int64 positions counted from each document's first token."""
    length = document_ids.shape[1]
    index = np.broadcast_to(np.arange(length, dtype=np.int64), document_ids.shape)
    return index - np.maximum.accumulate(np.where(run_starts(document_ids), index, 0), axis=1)


def document_offsets(document_ids: np.ndarray, attention_mask: np.ndarray | None = None) -> np.ndarray:
    """(B, T) document ids (and padding mask, 1 = real) -> (N+1,) int32 offsets of the batch's N documents (each
    maximal run of one id and one mask value in a row: padding is a run of its own) in its B*T tokens flattened
    row by row: FlashAttention's variable-length `cu_seqlens`, worked out on the host so that the device never
    has to report where documents end."""
    starts = run_starts(document_ids)
    if attention_mask is not None:
        starts |= run_starts(attention_mask)
    return np.append(np.flatnonzero(starts), document_ids.size).astype(np.int32)


__all__ = ["DOCUMENT_VIEWS", "DocumentView", "document_positions", "document_offsets"]

"""The global token stream: a deterministic function from (seed, epoch) to an order of documents.

Stream units: each document's tokens followed by one [SEP]. Epoch e lays the shards out in an order
shuffled by (seed, e); inside a shard, documents are cut into blocks of `window` consecutive
documents and each block is permuted by (seed, e, shard, block) -- a bounded-window shuffle whose
state is a pure function, so any position can be reached without reading what precedes it.
Every epoch has the same length, so a global position p is epoch p // L, offset p % L, and epochs
follow one another seamlessly.

Locating an offset: shard (bisect over <= few thousand shard starts) -> block (bisect over the
block-start array, computed once per shard from every `window`-th offset) -> document (cumulative
lengths of the block's permuted documents). Only the index is read, never tokens.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from data_pipeline.config import SEP_ID
from data_pipeline.shards import Corpus

_SHARD_ORDER_KEY = 0x5A4D  # separates the RNG streams of shard order, block order and masking
_BLOCK_KEY = 0xB10C


class TokenStream:
    """Reads ranges of the global stream; stateless apart from caches."""

    def __init__(self, corpus: Corpus, seed: int, shuffle: bool = True, window: int = 1024,
                 max_epochs: int | None = None):
        self.corpus, self.seed, self.shuffle, self.window = corpus, int(seed), shuffle, int(window)
        self.max_epochs = max_epochs
        self.shard_units = np.array([s.tokens + s.documents for s in corpus.shards], dtype=np.int64)
        self.epoch_length = int(self.shard_units.sum())
        self._block_starts: dict[int, np.ndarray] = {}
        self._epoch_layout: OrderedDict = OrderedDict()
        self._blocks: OrderedDict = OrderedDict()

    @property
    def end(self) -> int | None:
        """Global position where the stream stops (None: endless)."""
        return None if self.max_epochs is None else self.max_epochs * self.epoch_length

    def read(self, position: int, count: int) -> np.ndarray:
        """Units [position, position + count) of the global stream, shorter if the stream ends."""
        if self.end is not None:
            count = max(0, min(count, self.end - position))
        out = np.empty(count, dtype=np.int64)
        filled = 0
        while filled < count:
            filled += self._read_some(position + filled, out[filled:])
        return out

    def _read_some(self, position: int, out: np.ndarray) -> int:
        """Copy units from the document holding `position`; returns how many were written."""
        epoch, offset = divmod(position, self.epoch_length)
        order, starts = self._layout(epoch)
        k = int(np.searchsorted(starts, offset, side="right")) - 1
        shard_id = int(order[k])
        shard = self.corpus.shards[shard_id]
        within = offset - int(starts[k])
        block_starts = self._shard_blocks(shard_id)
        b = int(np.searchsorted(block_starts, within, side="right")) - 1
        docs, doc_starts = self._block(epoch, shard_id, b)
        within -= int(block_starts[b])
        j = int(np.searchsorted(doc_starts, within, side="right")) - 1
        doc = int(docs[j])
        into_doc = within - int(doc_starts[j])
        begin, end = int(shard.offsets[doc]), int(shard.offsets[doc + 1])
        tokens = shard.token_ids[begin + min(into_doc, end - begin):end]
        n = min(len(tokens), len(out))
        out[:n] = tokens[:n]
        if n < len(out):  # the [SEP] closing the document
            out[n] = SEP_ID
            n += 1
        return n

    def _layout(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(shard order, start offset of each shard in that order) for an epoch."""
        if epoch not in self._epoch_layout:
            n = len(self.corpus.shards)
            order = (np.random.default_rng([self.seed, _SHARD_ORDER_KEY, epoch]).permutation(n)
                     if self.shuffle else np.arange(n))
            starts = np.concatenate([[0], np.cumsum(self.shard_units[order])[:-1]])
            self._epoch_layout[epoch] = (order, starts)
            if len(self._epoch_layout) > 4:
                self._epoch_layout.popitem(last=False)
        return self._epoch_layout[epoch]

    def _shard_blocks(self, shard_id: int) -> np.ndarray:
        """Start (in units) of each block of `window` documents; independent of the permutation."""
        if shard_id not in self._block_starts:
            shard = self.corpus.shards[shard_id]
            first_docs = np.arange(0, shard.documents, self.window, dtype=np.int64)
            self._block_starts[shard_id] = np.asarray(shard.offsets[first_docs]) + first_docs
        return self._block_starts[shard_id]

    def _block(self, epoch: int, shard_id: int, block: int) -> tuple[np.ndarray, np.ndarray]:
        """(documents of the block in stream order, start of each within the block)."""
        key = (epoch, shard_id, block)
        cached = self._blocks.get(key)
        if cached is not None:
            self._blocks.move_to_end(key)
            return cached
        shard = self.corpus.shards[shard_id]
        first = block * self.window
        last = min(first + self.window, shard.documents)
        docs = np.arange(first, last, dtype=np.int64)
        if self.shuffle:
            rng = np.random.default_rng([self.seed, _BLOCK_KEY, epoch, shard_id, block])
            docs = docs[rng.permutation(len(docs))]
        offsets = np.asarray(shard.offsets[first:last + 1])
        lengths = (offsets[1:] - offsets[:-1])[docs - first] + 1  # +1: the closing [SEP]
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        self._blocks[key] = (docs, starts)
        if len(self._blocks) > 64:
            self._blocks.popitem(last=False)
        return docs, starts

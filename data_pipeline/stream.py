"""The global token stream: per epoch a seeded permutation of ALL documents, read through K lanes.

Order. Epoch e lays every document of the split (its tokens, then one [SEP]) out in the order of a
permutation of all documents drawn from (seed, e): the epoch stream D_e, L units long (the same L
every epoch). D_e is cut at fixed unit positions b_l = l * L // K into K lanes. Lane l is endless:
its part of D_0, one [SEP] (so text from two places never runs together), its part of D_1, [SEP],
... The run's sequence n reads the next units of lane n mod K (`SpanHistory` says how far each lane
has got), so the G sequences of a global batch come from G different lanes: G far-apart places of
a random document order, a sample of the whole corpus whatever the shards or the input order. A
document longer than a sequence stays contiguous in its lane and is read on, piece by piece, every
K sequences: long sequences still see long documents whole, yet no batch is dominated by one.

Seeking. Per epoch: the permutation (int32, n_docs) and the start of every 64th permuted document
(int64, n_docs / 64), built in O(n_docs) and cached for two epochs (lanes cross an epoch boundary a
few steps apart): ~4.1 bytes per document and epoch, ~85 MB for two epochs of 10^7 documents, plus
4 bytes per document of lengths. Unit position -> document is a bisection of the block starts and
a cumulative sum inside one block of 64; document -> shard a bisection of the shard starts; tokens
come from the shard's memory map. Nothing before the position is read, whatever the position.
"""
from __future__ import annotations

import bisect
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from data_pipeline.errors import DataError
from data_pipeline.shards import Corpus

_DOCUMENT_ORDER_KEY = 0xD0C5  # separates the RNG stream of the document order from masking's
_BLOCK = 64  # documents per stored start: memory / 64 for a cumulative sum of <= 64 lengths per seek
MIN_LANE_UNITS = 4096
"""Default lane count keeps each lane at least this long (a lane is read a few sequences at a time)."""
MAX_LANES = 4096
"""Default lane count cap: K >= the global batch's sequences is what mixing needs; beyond that more
lanes only spread a long document over more steps."""


def default_lanes(epoch_length: int) -> int:
    return max(1, min(MAX_LANES, epoch_length // MIN_LANE_UNITS))


class TokenStream:
    """Reads the epoch streams D_e and the lanes cut from them; stateless apart from caches."""

    def __init__(self, corpus: Corpus, seed: int, shuffle: bool = True, lanes: int | None = None,
                 max_epochs: int | None = None, order_key: int | None = None):
        """order_key: added to the seed of the document order (one named source's own order); None
        for the whole corpus."""
        self.corpus, self.seed, self.shuffle, self.max_epochs = corpus, int(seed), shuffle, max_epochs
        self._order_seed = [self.seed, _DOCUMENT_ORDER_KEY] + ([] if order_key is None else [int(order_key)])
        self.sep_id = corpus.special_ids.sep_token
        # Units (tokens + the closing [SEP]) of every document, documents numbered shard by shard.
        self._doc_units = np.concatenate([np.diff(np.asarray(s.offsets)).astype(np.int32) + 1
                                          for s in corpus.shards])
        self._shard_first_doc = np.cumsum([0] + [s.documents for s in corpus.shards]).tolist()
        self.documents = len(self._doc_units)
        self.epoch_length = int(self._doc_units.sum(dtype=np.int64))
        self.lanes = default_lanes(self.epoch_length) if lanes is None else int(lanes)
        if not 1 <= self.lanes <= self.epoch_length:
            raise DataError(f"lanes: {self.lanes} must be in [1, {self.epoch_length}] (units in one epoch)")
        self.lane_starts = np.arange(self.lanes + 1, dtype=np.int64) * self.epoch_length // self.lanes
        self.lane_period = np.diff(self.lane_starts) + 1  # (K,) the lane's part of one epoch + its [SEP]
        self.lane_ends = None if max_epochs is None else max_epochs * self.lane_period
        """(K,) lane offset where a max_epochs stream's lane stops; None: endless."""
        self._orders: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._shard_views: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(corpus.shards)

    def read_lane(self, lane: int, offset: int, count: int) -> np.ndarray:
        """Units [offset, offset + count) of lane `lane`, shorter where a max_epochs lane stops."""
        period = int(self.lane_period[lane])
        if self.lane_ends is not None:
            count = max(0, min(count, int(self.lane_ends[lane]) - offset))
        out = np.empty(count, dtype=np.int64)
        filled = 0
        while filled < count:
            epoch, within = divmod(offset + filled, period)
            if within == period - 1:  # the [SEP] closing this lane's part of the epoch
                out[filled] = self.sep_id
                filled += 1
                continue
            filled += self.fill_from_epoch(epoch, int(self.lane_starts[lane]) + within,
                                           out[filled:filled + period - 1 - within])
        return out

    def fill_from_epoch(self, epoch: int, position: int, out: np.ndarray) -> int:
        """Copy units [position, ...) of D_epoch into `out`; returns how many (fewer at the epoch's end)."""
        perm, block_starts = self._order(epoch)
        count = min(len(out), self.epoch_length - position)
        block = int(np.searchsorted(block_starts, position, side="right")) - 1
        first = block * _BLOCK
        ends = np.cumsum(self._doc_units[perm[first:first + _BLOCK]]) + int(block_starts[block])
        j = first + int(np.searchsorted(ends, position, side="right"))
        into, filled = position - (int(ends[j - first - 1]) if j > first else int(block_starts[block])), 0
        while filled < count:
            tokens = self._document_tokens(int(perm[j]))
            n = min(len(tokens) - into, count - filled) if into < len(tokens) else 0
            out[filled:filled + n] = tokens[into:into + n]
            filled += n
            if filled < count:  # the document's tokens are used up: its [SEP], then the next document
                out[filled] = self.sep_id
                filled += 1
                j, into = j + 1, 0
        return count

    def _document_tokens(self, doc: int) -> np.ndarray:
        k = bisect.bisect_right(self._shard_first_doc, doc) - 1
        views = self._shard_views[k]
        if views is None:  # plain ndarray views: slicing a np.memmap costs several times more
            shard = self.corpus.shards[k]
            views = self._shard_views[k] = (np.asarray(shard.token_ids), np.asarray(shard.offsets))
        tokens, offsets = views
        local = doc - self._shard_first_doc[k]
        return tokens[offsets[local]:offsets[local + 1]]

    def _order(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(documents of D_epoch in order, start unit of every _BLOCK-th of them): built once per epoch."""
        cached = self._orders.get(epoch)
        if cached is not None:
            self._orders.move_to_end(epoch)
            return cached
        perm = np.arange(self.documents, dtype=np.int32)
        if self.shuffle:
            np.random.default_rng([*self._order_seed, epoch]).shuffle(perm)
        block_units = np.add.reduceat(self._doc_units[perm], np.arange(0, self.documents, _BLOCK), dtype=np.int64)
        block_starts = np.zeros(len(block_units), dtype=np.int64)
        np.cumsum(block_units[:-1], out=block_starts[1:])
        self._orders[epoch] = (perm, block_starts)
        if len(self._orders) > 2:
            self._orders.popitem(last=False)
        return perm, block_starts


@dataclass
class SpanHistory:
    """How many units each sequence of the run reads: seq_len - 1, changing at stage boundaries.

    `segments` holds [first sequence, span] pairs, starts increasing from 0; a segment lasts until
    the next one starts. Sequence n reads lane n mod K; the lane has already given its earlier
    sequences n - K, n - 2K, ... their spans, so its offset is a sum over the (few) segments of
    span x (how many of that lane's sequences the segment holds): O(segments), whatever n.
    """

    segments: list[list[int]] = field(default_factory=list)

    def record(self, first_sequence: int, span: int) -> None:
        """Sequences from `first_sequence` on read `span` units (no-op if that is already so)."""
        if self.segments and self.segments[-1][1] == span:
            return
        if self.segments and self.segments[-1][0] == first_sequence:  # a segment that never ran
            self.segments.pop()
            if self.segments and self.segments[-1][1] == span:
                return
        self.segments.append([int(first_sequence), int(span)])

    def units_before(self, n: int) -> int:
        """Units read by sequences 0 .. n-1 altogether."""
        total = 0
        for (start, span), stop in zip(self.segments, self._stops()):
            total += span * max(0, min(stop, n) - start)
        return total

    def lane_offsets(self, lanes: np.ndarray, n: int | np.ndarray, k: int) -> np.ndarray:
        """Units lane `lanes` has given to its sequences before sequence `n` (arrays broadcast)."""
        lanes = np.asarray(lanes, dtype=np.int64)
        n = np.asarray(n, dtype=np.int64)
        total = np.zeros(np.broadcast(lanes, n).shape, dtype=np.int64)
        for (start, span), stop in zip(self.segments, self._stops()):
            end = np.minimum(stop, n)
            total += span * np.maximum(0, _count_in_lane(lanes, end, k) - _count_in_lane(lanes, start, k))
        return total

    def _stops(self) -> list[int]:
        return [s[0] for s in self.segments[1:]] + [np.iinfo(np.int64).max]

    def check(self, sequences: int) -> None:
        """DataError unless the segments are well formed for a reader at sequence `sequences`."""
        previous = -1
        for i, seg in enumerate(self.segments):
            if (not isinstance(seg, list) or len(seg) != 2 or not all(isinstance(v, int) for v in seg)
                    or seg[1] < 1 or seg[0] <= previous or seg[0] > sequences or (i == 0 and seg[0] != 0)):
                raise DataError(f"data state: spans[{i}] {seg!r} is not [first sequence, units >= 1] "
                                f"with first sequences increasing from 0 up to {sequences}")
            previous = seg[0]
        if sequences > 0 and not self.segments:
            raise DataError(f"data state: spans is empty although {sequences} sequences were consumed")


def _count_in_lane(lanes: np.ndarray, end, k: int) -> np.ndarray:
    """How many of 0 .. end-1 fall in each lane (n in lane n mod k); end >= 0."""
    return (end - lanes + k - 1) // k

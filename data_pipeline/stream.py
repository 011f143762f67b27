"""The token stream: per epoch a seeded permutation of ALL documents (or, in shard_window order, of
windows of shards and of the documents inside each), read through K lanes.

Order. Epoch e lays every document of the split (its tokens, then one [SEP]) out in the order of a
permutation of all documents drawn from (seed, e): the epoch stream D_e, L units long (the same L
every epoch). D_e is cut at fixed unit positions b_l = l * L // K into K lanes. Lane l is endless:
its part of D_0, one [SEP] (so text from two places never runs together), its part of D_1, [SEP],
... The run's sequence n reads the next units of lane n mod K (`SpanHistory` says how far each lane
has got), so the G sequences of a global batch come from G different lanes: G far-apart places of
a random document order, a sample of the whole corpus whatever the shards or the input order. A
document longer than a sequence stays contiguous in its lane and is read on, piece by piece, every
K sequences: long sequences still see long documents whole, yet no batch is dominated by one.

Order shard_window (for a node-local cache smaller than the corpus, data_pipeline/remote/). The shards
are grouped into windows of `shard_window` shards, once per stream (which shards share a window is
seeded); D_e lays out the windows in a seeded order per epoch, each window's documents in a seeded order
of their own. Lanes are cut per window: lane l's part of window w is [l * U_w // K, (l+1) * U_w // K)
of it, closed by one [SEP], and the lane reads its parts of the epoch's windows in turn, so every lane
crosses into the next window within a few steps and a reader holds two windows at a time (`end_batch`
lets the others go). The global order is the case of one window: the stream above, bit for bit.

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

from data_pipeline.config import ORDERS
from data_pipeline.errors import DataError
from data_pipeline.shards import Corpus

_DOCUMENT_ORDER_KEY = 0xD0C5  # separates the RNG stream of the document order from masking's
_WINDOW_KEY = 0x5717D0  # the shard_window order's draws (window members, window order) apart from the documents'
_BLOCK = 64  # documents per stored start: memory / 64 for a cumulative sum of <= 64 lengths per seek
MIN_LANE_UNITS = 4096
"""Default lane count keeps each lane at least this long (a lane is read a few sequences at a time)."""
MAX_LANES = 4096
"""Default lane count cap: K >= the global batch's sequences is what mixing needs; beyond that more
lanes only spread a long document over more steps."""


def window_cache_need(train: Corpus, valid: Corpus, shard_window: int) -> int:
    """Bytes of shards a shard_window reader holds at once, at most: two windows (the one read and the next,
    which lanes reach a few steps apart) of each source's training stream and of the validation stream; a
    window counted as its source's `shard_window` largest shards."""
    def two_windows(corpus: Corpus) -> int:
        sizes = sorted((s.tokens * s.dtype.itemsize for s in corpus.shards), reverse=True)
        return sum(sizes[:2 * shard_window])

    sources = {s.source for s in train.shards}
    return sum(two_windows(train.source_corpus(name)) for name in sources) + two_windows(valid)


def default_lanes(epoch_length: int) -> int:
    return max(1, min(MAX_LANES, epoch_length // MIN_LANE_UNITS))


class TokenStream:
    """Reads the epoch streams D_e and the lanes cut from them; stateless apart from caches and the
    shards it holds (remote data: see `end_batch`)."""

    def __init__(self, corpus: Corpus, seed: int, shuffle: bool = True, lanes: int | None = None,
                 max_epochs: int | None = None, order_key: int | None = None, order: str = "global",
                 shard_window: int = 8):
        """order_key: added to the seed of the document order (one named source's own order); None
        for the whole corpus. order: 'global' or 'shard_window' (windows of `shard_window` shards)."""
        if order not in ORDERS:
            raise DataError(f"order: {order!r} is not one of {', '.join(ORDERS)}")
        self.corpus, self.seed, self.shuffle, self.max_epochs = corpus, int(seed), shuffle, max_epochs
        self.order, self.shard_window = order, int(shard_window)
        self._order_seed = [self.seed, _DOCUMENT_ORDER_KEY] + ([] if order_key is None else [int(order_key)])
        self.sep_id = corpus.special_ids.sep_token
        # Units (tokens + the closing [SEP]) of every document, documents numbered shard by shard.
        self._doc_units = np.concatenate([np.diff(np.asarray(s.offsets)).astype(np.int32) + 1
                                          for s in corpus.shards])
        self._shard_first_doc = np.cumsum([0] + [s.documents for s in corpus.shards]).tolist()
        self.documents = len(self._doc_units)
        self.epoch_length = int(self._doc_units.sum(dtype=np.int64))
        self.windows = self._make_windows()
        """Shard indices of each window (fixed for the stream; one window of every shard in global order)."""
        self._window_of = np.empty(len(corpus.shards), dtype=np.int64)
        for w, members in enumerate(self.windows):
            self._window_of[members] = w
        shard_units = np.add.reduceat(self._doc_units, self._shard_first_doc[:-1], dtype=np.int64)
        self.window_units = np.asarray([int(shard_units[m].sum()) for m in self.windows], dtype=np.int64)
        self.lanes = default_lanes(int(self.window_units.min())) if lanes is None else int(lanes)
        if not 1 <= self.lanes <= int(self.window_units.min()):
            raise DataError(f"lanes: {self.lanes} must be in [1, {int(self.window_units.min())}] (units in one "
                            f"epoch{'' if order == 'global' else ' of the smallest shard window'})")
        k = np.arange(self.lanes + 1, dtype=np.int64)
        self._part_starts = self.window_units[:, None] * k // self.lanes
        """(windows, K+1): where each lane's part of a window starts (lane l's part is [starts[l], starts[l+1]))."""
        self._part_units = np.diff(self._part_starts, axis=1) + 1
        """(windows, K): units of each lane's part of a window, with the [SEP] closing it."""
        self.lane_starts = self._part_starts[0] if order == "global" else None
        """Global order: (K+1,) where each lane's part of D_e starts (b_l = l * L // K)."""
        self.lane_period = self._part_units.sum(axis=0)
        """(K,) units of the lane per epoch: its part of every window, each closed by one [SEP]."""
        self.epoch_units = int(self.lane_period.sum())
        """Units of one epoch over all lanes (the documents' and the [SEP]s closing the lane parts)."""
        self.lane_ends = None if max_epochs is None else max_epochs * self.lane_period
        """(K,) lane offset where a max_epochs stream's lane stops; None: endless."""
        self._orders: OrderedDict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = OrderedDict()
        self._shard_views: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(corpus.shards)
        self._touched: set[int] = set()
        self._touched_before: set[int] = set()
        self._held: set[int] = set()
        self._frontier = (0, 0)
        self._prefetching = False
        """Fetching ahead starts with the first batch read: checks that open a stream and read nothing
        (`roformer plan`, the launching side of `pretrain`) download no shard."""

    def _make_windows(self) -> list[np.ndarray]:
        count = len(self.corpus.shards)
        if self.order == "global":
            return [np.arange(count)]
        shards = np.arange(count)
        if self.shuffle:  # which shards share a window: seeded once, fixed for the stream
            np.random.default_rng([*self._order_seed, _WINDOW_KEY]).shuffle(shards)
        return [np.sort(shards[i:i + self.shard_window]) for i in range(0, count, self.shard_window)]

    def read_lane(self, lane: int, offset: int, count: int) -> np.ndarray:
        """Units [offset, offset + count) of lane `lane`, shorter where a max_epochs lane stops."""
        period = int(self.lane_period[lane])
        if self.lane_ends is not None:
            count = max(0, min(count, int(self.lane_ends[lane]) - offset))
        out = np.empty(count, dtype=np.int64)
        filled = 0
        while filled < count:
            epoch, within = divmod(offset + filled, period)
            window_order, window_starts = self._epoch_windows(epoch)
            parts = self._part_units[window_order, lane]  # this lane's part of each window, in epoch order
            ends = np.cumsum(parts)
            j = int(np.searchsorted(ends, within, side="right"))
            inner = within - (int(ends[j - 1]) if j else 0)
            self._frontier = max(self._frontier, (epoch, j))
            if inner == parts[j] - 1:  # the [SEP] closing this lane's part of the window
                out[filled] = self.sep_id
                filled += 1
                continue
            w = int(window_order[j])
            position = int(window_starts[j]) + int(self._part_starts[w, lane]) + inner
            filled += self.fill_from_epoch(epoch, position, out[filled:filled + int(parts[j]) - 1 - inner])
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
        self._touched.add(int(self._window_of[k]))
        views = self._shard_views[k]
        if views is None:  # plain ndarray views: slicing a np.memmap costs several times more
            shard = self.corpus.shards[k]
            views = self._shard_views[k] = (np.asarray(shard.token_ids), np.asarray(shard.offsets))
        tokens, offsets = views
        local = doc - self._shard_first_doc[k]
        return tokens[offsets[local]:offsets[local + 1]]

    def _order(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(documents of D_epoch in order, start unit of every _BLOCK-th of them)."""
        return self._epoch(epoch)[:2]

    def _epoch_windows(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(the windows of D_epoch in order, the start unit of each of them)."""
        return self._epoch(epoch)[2:]

    def _epoch(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """_order's and _epoch_windows' arrays, built once per epoch. Global order: one permutation of all documents.
        shard_window: the windows in a seeded order, each one's documents in a seeded order of their own."""
        cached = self._orders.get(epoch)
        if cached is not None:
            self._orders.move_to_end(epoch)
            return cached
        if self.order == "global":
            window_order = np.zeros(1, dtype=np.int64)
            perm = np.arange(self.documents, dtype=np.int32)
            if self.shuffle:
                np.random.default_rng([*self._order_seed, epoch]).shuffle(perm)
        else:
            window_order = np.arange(len(self.windows), dtype=np.int64)
            if self.shuffle:
                np.random.default_rng([*self._order_seed, _WINDOW_KEY, epoch]).shuffle(window_order)
            pieces = []
            for w in window_order:
                docs = np.concatenate([np.arange(self._shard_first_doc[k], self._shard_first_doc[k + 1],
                                                 dtype=np.int32) for k in self.windows[w]])
                if self.shuffle:
                    np.random.default_rng([*self._order_seed, epoch, int(w)]).shuffle(docs)
                pieces.append(docs)
            perm = np.concatenate(pieces)
        window_starts = np.concatenate([[0], np.cumsum(self.window_units[window_order])[:-1]]).astype(np.int64)
        block_units = np.add.reduceat(self._doc_units[perm], np.arange(0, self.documents, _BLOCK), dtype=np.int64)
        block_starts = np.zeros(len(block_units), dtype=np.int64)
        np.cumsum(block_units[:-1], out=block_starts[1:])
        self._orders[epoch] = (perm, block_starts, window_order, window_starts)
        if len(self._orders) > 2:
            self._orders.popitem(last=False)
        return self._orders[epoch]

    def end_batch(self) -> None:
        """After each batch: shards of windows not read in this batch nor the one before are let go (their
        memory maps closed, so a remote shard's cached copy may be evicted), and the window after the newest
        one read is fetched ahead. Global order has one window: nothing is let go."""
        keep = self._touched | self._touched_before
        for w in self._held - keep:
            self._release_window(w)
        self._held = (self._held & keep) | self._touched
        self._touched_before, self._touched = self._touched, set()
        if self.corpus.remote is None:
            return
        if self.order != "global":
            self._prefetch_after(*self._frontier)
        elif not self._prefetching:  # every shard is needed every few steps
            self.corpus.remote.prefetcher.want([s.remote_object for s in self.corpus.shards])
        self._prefetching = True

    def release_all(self) -> None:
        for w in self._held | self._touched:
            self._release_window(w)
        self._held, self._touched, self._touched_before = set(), set(), set()

    def _release_window(self, w: int) -> None:
        for k in self.windows[w]:
            self._shard_views[k] = None
            self.corpus.shards[k].release()

    def _prefetch_after(self, epoch: int, j: int) -> None:
        """Fetch the shards of the window after window j of `epoch` ahead of their first read."""
        count = len(self.windows)
        epoch, j = (epoch, j + 1) if j + 1 < count else (epoch + 1, 0)
        w = int(self._epoch_windows(epoch)[0][j])
        self.corpus.remote.prefetcher.want([self.corpus.shards[k].remote_object for k in self.windows[w]],
                                           first=True)


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

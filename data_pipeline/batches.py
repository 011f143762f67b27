"""Packed, masked MLM batches from the global token stream, split across data-parallel ranks.

Each sequence is [CLS] + the next (seq_len - 1) units of one lane of the global stream (documents
in a per-epoch permutation of the whole corpus, joined by [SEP]; long documents continue in the
lane's next sequence; see stream.py). Sequence n of the run reads lane n mod K. A call to
`next_batch(seq_len, mb)` hands out the next world_size * mb sequences; rank r builds only sequences
r*mb .. (r+1)*mb-1 of that global batch. Where each starts is arithmetic on n and the history of
spans (seq_len - 1 per stage), so skipping the other ranks' sequences costs nothing, and:
  * every global batch is a sample of the whole corpus (its sequences come from different lanes);
  * ranks never overlap; together they cover each token once per epoch;
  * all ranks run the same number of steps (the global stream is the same for everyone);
  * the state (sequences handed out + span history) is global: valid for any world size and any
    next seq_len.
Masking uses a counter-based RNG keyed by (seed, global sequence index): no RNG state to save, and
the same masks whatever the rank layout.
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from data_pipeline.config import CLS_ID, MIN_SEQ_LEN, PAD_ID
from data_pipeline.errors import DataError
from data_pipeline.masking import IGNORE_INDEX, MaskingConfig, mask_tokens
from data_pipeline.shards import Corpus
from data_pipeline.stream import SpanHistory, TokenStream

STATE_FORMAT = 2
STATE_ORDER = "global order (per-epoch permutation of all documents, read through lanes)"
_OLD_FORMATS = {1: "shard-window order (shards permuted per epoch, documents shuffled in 1024-document windows)"}
_MASK_KEY = 0x4D41534B


def check_state_format(state: dict) -> None:
    """DataError (one line, saying why) unless `state` was saved by this reader's format.

    Needs no corpus: a launcher can call it on a checkpoint's data state before spending compute.
    """
    if not isinstance(state, dict):
        raise DataError(f"data state: expected a mapping, got {type(state).__name__}")
    fmt = state.get("format", state.get("version"))  # format 1 called the field "version"
    if fmt in _OLD_FORMATS:
        raise DataError(f"data state format {fmt} ({_OLD_FORMATS[fmt]}) cannot be resumed by format "
                        f"{STATE_FORMAT} ({STATE_ORDER}): its position counts units of the old order, so "
                        f"resuming would neither continue that stream nor keep each token once per epoch; "
                        f"finish the run with the release that started it, or start a new run")
    if fmt != STATE_FORMAT:
        raise DataError(f"data state: format {fmt!r} is not {STATE_FORMAT} ({STATE_ORDER})")


class PretrainBatches:
    """Batches for one data-parallel rank. See the module docstring for the guarantees."""

    def __init__(self, corpus: Corpus, rank: int = 0, world_size: int = 1, seed: int = 0,
                 masking: MaskingConfig | None = None, shuffle: bool = True, lanes: int | None = None,
                 max_epochs: int | None = None):
        if world_size < 1 or not 0 <= rank < world_size:
            raise DataError(f"rank/world_size: rank {rank} is not in [0, {world_size})")
        if max_epochs is not None and max_epochs < 1:
            raise DataError(f"max_epochs: {max_epochs} must be >= 1")
        self.corpus, self.rank, self.world_size, self.seed = corpus, rank, world_size, int(seed)
        self.masking = masking or MaskingConfig()
        self.stream = TokenStream(corpus, self.seed, shuffle=shuffle, lanes=lanes, max_epochs=max_epochs)
        self._word_starts = corpus.word_starts() if self.masking.whole_word else None
        self.sequences_consumed = 0
        """Global count of sequences handed out (all ranks together); also the masking key."""
        self.spans = SpanHistory()
        """Units per sequence (seq_len - 1) since which sequence: where every lane has got to."""

    @property
    def position(self) -> int:
        """Units of the stream handed out so far (all lanes, all ranks)."""
        return self.spans.units_before(self.sequences_consumed)

    @property
    def tokens_consumed(self) -> int:
        """Global count of token slots handed out (all ranks, including [CLS] and padding)."""
        return self.position + self.sequences_consumed

    @property
    def epoch(self) -> int:
        """Epochs completed, counted in units (lanes cross an epoch boundary a few steps apart)."""
        return self.position // (self.stream.epoch_length + self.stream.lanes)

    def check_min_size(self, seq_len: int, global_batch: int) -> None:
        """DataError unless one epoch holds at least one global batch of `global_batch` x seq_len."""
        need = global_batch * (seq_len - 1)
        if self.stream.epoch_length < need:
            raise DataError(f"{self.corpus.data_dir / self.corpus.split}: corpus has "
                            f"{self.stream.epoch_length} tokens (with [SEP]s), fewer than one global batch "
                            f"of {global_batch} sequences x {seq_len - 1} tokens = {need}")

    def next_batch(self, seq_len: int, micro_batch_size: int) -> dict[str, torch.Tensor] | None:
        """This rank's micro-batch of the next global batch; None once a max_epochs stream is over.

        input_ids (B, T) long, attention_mask (B, T) long, labels (B, T) long (-100 = ignore).
        """
        if seq_len < MIN_SEQ_LEN:
            raise DataError(f"seq_len: {seq_len} must be >= {MIN_SEQ_LEN} ([CLS] plus at least one token)")
        if micro_batch_size < 1:
            raise DataError(f"micro_batch_size: {micro_batch_size} must be >= 1")
        if self._stream_over():
            return None
        span = seq_len - 1
        self.spans.record(self.sequences_consumed, span)
        first = self.sequences_consumed + self.rank * micro_batch_size
        n = np.arange(first, first + micro_batch_size, dtype=np.int64)
        lanes = n % self.stream.lanes
        offsets = self.spans.lane_offsets(lanes, n, self.stream.lanes)
        rows = [self.stream.read_lane(int(lane), int(offset), span) for lane, offset in zip(lanes, offsets)]
        self.sequences_consumed += self.world_size * micro_batch_size
        return self._build(rows, first, seq_len)

    def skip(self, seq_len: int, sequences: int) -> None:
        """Pass over the next `sequences` global sequences of `seq_len` as if they had been handed out
        (the numerics guard's rewind past a stretch of bad data). Only the position moves, so the skip is
        part of the state: a resume from any later checkpoint continues the same stream."""
        if seq_len < MIN_SEQ_LEN:
            raise DataError(f"seq_len: {seq_len} must be >= {MIN_SEQ_LEN} ([CLS] plus at least one token)")
        if sequences < 0:
            raise DataError(f"sequences: {sequences} must be >= 0")
        if sequences:
            self.spans.record(self.sequences_consumed, seq_len - 1)
            self.sequences_consumed += sequences

    def _stream_over(self) -> bool:
        """True when every lane of a max_epochs stream is used up (the same answer on every rank)."""
        ends = self.stream.lane_ends
        if ends is None:
            return False
        lanes = np.arange(self.stream.lanes)
        return bool((self.spans.lane_offsets(lanes, self.sequences_consumed, self.stream.lanes) >= ends).all())

    def iter_eval_batches(self, seq_len: int, micro_batch_size: int,
                          max_batches: int | None = None) -> Iterator[dict[str, torch.Tensor]]:
        """One pass over epoch 0's document order, read straight through (no lanes); leaves state alone.

        Every call yields the same batches, so periodic validation compares like with like; the
        first N tokens scored are the same documents at every seq_len, and a random sample of them.
        """
        span, global_batch = seq_len - 1, self.world_size * micro_batch_size
        epoch_end = self.stream.epoch_length
        produced = 0
        while produced * global_batch * span < epoch_end and (max_batches is None or produced < max_batches):
            first = produced * global_batch + self.rank * micro_batch_size
            rows = []
            for k in range(first, first + micro_batch_size):
                out = np.empty(max(0, min(span, epoch_end - k * span)), dtype=np.int64)
                if len(out):
                    self.stream.fill_from_epoch(0, k * span, out)
                rows.append(out)
            yield self._build(rows, first, seq_len)
            produced += 1

    def _build(self, rows: list[np.ndarray], first_index: int, seq_len: int) -> dict[str, torch.Tensor]:
        """Pack `rows` (units after [CLS]; row i is global sequence first_index + i) and mask them."""
        input_ids = np.full((len(rows), seq_len), PAD_ID, dtype=np.int64)  # (B, T)
        labels = np.full((len(rows), seq_len), IGNORE_INDEX, dtype=np.int64)  # (B, T)
        attention = np.zeros((len(rows), seq_len), dtype=np.int64)  # (B, T)
        for row, units in enumerate(rows):
            if len(units) == 0:
                continue  # past the end of the stream: an all-padding row, ignored by the loss
            seq = np.concatenate([[CLS_ID], units])
            rng = np.random.default_rng([self.seed, _MASK_KEY, first_index + row])
            corrupted, seq_labels = mask_tokens(seq, rng, self.masking, self.corpus.vocab_size,
                                                self._word_starts)
            n = len(seq)
            input_ids[row, :n] = corrupted
            labels[row, :n] = seq_labels
            attention[row, :n] = 1
        return {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(attention),
                "labels": torch.from_numpy(labels)}

    def state_dict(self) -> dict:
        """JSON-serializable global state; the same on every rank."""
        return {"format": STATE_FORMAT, "sequences_consumed": self.sequences_consumed,
                "tokens_consumed": self.tokens_consumed, "spans": [list(s) for s in self.spans.segments],
                "seed": self.seed, "shuffle": self.stream.shuffle, "lanes": self.stream.lanes,
                "corpus": self.corpus.fingerprint}

    def check_state(self, state: dict) -> None:
        """DataError unless this reader can resume `state` exactly (format, stream definition, shape)."""
        check_state_format(state)
        mine = self.state_dict()
        for key in ("seed", "shuffle", "lanes", "corpus"):
            if state.get(key) != mine[key]:
                raise DataError(f"data state: {key} {state.get(key)!r} differs from this reader's "
                                f"{mine[key]!r} (resuming would not continue the same stream)")
        sequences = state.get("sequences_consumed")
        if not isinstance(sequences, int) or sequences < 0:
            raise DataError(f"data state: sequences_consumed {sequences!r} is not a count")
        spans = state.get("spans")
        if not isinstance(spans, list):
            raise DataError(f"data state: spans {spans!r} is not a list of [first sequence, units]")
        history = SpanHistory([list(s) if isinstance(s, (list, tuple)) else s for s in spans])
        history.check(sequences)
        tokens = history.units_before(sequences) + sequences
        if state.get("tokens_consumed") != tokens:
            raise DataError(f"data state: tokens_consumed {state.get('tokens_consumed')!r} does not match "
                            f"its spans and sequences_consumed ({tokens})")

    def load_state_dict(self, state: dict) -> None:
        """Resume at the saved global point (O(1)); checks the stream definition is the same."""
        self.check_state(state)
        self.spans = SpanHistory([list(s) for s in state["spans"]])
        self.sequences_consumed = int(state["sequences_consumed"])

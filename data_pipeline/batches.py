"""Packed, masked MLM batches from the global token stream, split across data-parallel ranks.

Each sequence is [CLS] + the next (seq_len - 1) units of the global stream (documents joined by
[SEP], long documents continuing into the next sequence). A call to `next_batch(seq_len, mb)` moves
the GLOBAL position by world_size * mb sequences; rank r builds only sequences r*mb .. (r+1)*mb-1 of
that global batch. Their start positions are plain arithmetic (every sequence consumes exactly
seq_len - 1 units), so skipping the other ranks' sequences costs nothing, and:
  * ranks never overlap, together they cover each token once per epoch;
  * all ranks run the same number of steps (the global stream is the same for everyone);
  * the state is one global position, valid for any world size and any next seq_len.
Masking uses a counter-based RNG keyed by (seed, global sequence index): no RNG state to save, and
the same masks whatever the rank layout.
"""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from data_pipeline.config import CLS_ID, PAD_ID
from data_pipeline.errors import DataError
from data_pipeline.masking import IGNORE_INDEX, MaskingConfig, mask_tokens
from data_pipeline.shards import Corpus
from data_pipeline.stream import TokenStream

STATE_VERSION = 1
_MASK_KEY = 0x4D41534B


class PretrainBatches:
    """Batches for one data-parallel rank. See the module docstring for the guarantees."""

    def __init__(self, corpus: Corpus, rank: int = 0, world_size: int = 1, seed: int = 0,
                 masking: MaskingConfig | None = None, shuffle: bool = True, window: int = 1024,
                 max_epochs: int | None = None):
        if world_size < 1 or not 0 <= rank < world_size:
            raise DataError(f"rank/world_size: rank {rank} is not in [0, {world_size})")
        if window < 1:
            raise DataError(f"window: {window} must be >= 1")
        if max_epochs is not None and max_epochs < 1:
            raise DataError(f"max_epochs: {max_epochs} must be >= 1")
        self.corpus, self.rank, self.world_size, self.seed = corpus, rank, world_size, int(seed)
        self.masking = masking or MaskingConfig()
        self.stream = TokenStream(corpus, self.seed, shuffle=shuffle, window=window, max_epochs=max_epochs)
        self._word_starts = corpus.word_starts() if self.masking.whole_word else None
        self.position = 0
        """Global stream position (units, across epochs) where the next global batch starts."""
        self.sequences_consumed = 0
        """Global count of sequences handed out (all ranks together); also the masking key."""
        self.tokens_consumed = 0
        """Global count of token slots handed out (all ranks, including [CLS] and padding)."""

    @property
    def epoch(self) -> int:
        return self.position // self.stream.epoch_length

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
        if seq_len < 2:
            raise DataError(f"seq_len: {seq_len} must be >= 2 ([CLS] plus at least one token)")
        if micro_batch_size < 1:
            raise DataError(f"micro_batch_size: {micro_batch_size} must be >= 1")
        end = self.stream.end
        if end is not None and self.position >= end:
            return None
        batch = self._build(self.position, self.sequences_consumed, seq_len, micro_batch_size,
                            first=self.rank * micro_batch_size)
        global_batch = self.world_size * micro_batch_size
        self.position += global_batch * (seq_len - 1)
        self.sequences_consumed += global_batch
        self.tokens_consumed += global_batch * seq_len
        return batch

    def iter_eval_batches(self, seq_len: int, micro_batch_size: int,
                          max_batches: int | None = None) -> Iterator[dict[str, torch.Tensor]]:
        """Deterministic pass from the start of the stream (one epoch at most); leaves state alone.

        Every call yields the same batches, so periodic validation compares like with like.
        """
        position, seq_index, produced = 0, 0, 0
        epoch_end = self.stream.epoch_length
        while position < epoch_end and (max_batches is None or produced < max_batches):
            yield self._build(position, seq_index, seq_len, micro_batch_size,
                              first=self.rank * micro_batch_size, stop_at=epoch_end)
            position += self.world_size * micro_batch_size * (seq_len - 1)
            seq_index += self.world_size * micro_batch_size
            produced += 1

    def _build(self, position: int, seq_index: int, seq_len: int, micro_batch_size: int, first: int,
               stop_at: int | None = None) -> dict[str, torch.Tensor]:
        span = seq_len - 1
        input_ids = np.full((micro_batch_size, seq_len), PAD_ID, dtype=np.int64)  # (B, T)
        labels = np.full((micro_batch_size, seq_len), IGNORE_INDEX, dtype=np.int64)  # (B, T)
        attention = np.zeros((micro_batch_size, seq_len), dtype=np.int64)  # (B, T)
        for row in range(micro_batch_size):
            k = first + row  # index of this sequence within the global batch
            start = position + k * span
            count = span if stop_at is None else max(0, min(span, stop_at - start))
            units = self.stream.read(start, count)
            if len(units) == 0:
                continue  # past the end of the stream: an all-padding row, ignored by the loss
            seq = np.concatenate([[CLS_ID], units])
            rng = np.random.default_rng([self.seed, _MASK_KEY, seq_index + k])
            corrupted, seq_labels = mask_tokens(seq, rng, self.masking, self.corpus.vocab_size,
                                                self._word_starts)
            n = len(seq)
            input_ids[row, :n] = corrupted
            labels[row, :n] = seq_labels
            attention[row, :n] = 1
        return {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(attention),
                "labels": torch.from_numpy(labels)}

    def state_dict(self) -> dict:
        """JSON-serializable global position; the same on every rank."""
        return {"version": STATE_VERSION, "position": self.position,
                "sequences_consumed": self.sequences_consumed, "tokens_consumed": self.tokens_consumed,
                "seed": self.seed, "shuffle": self.stream.shuffle, "window": self.stream.window,
                "corpus": self.corpus.fingerprint}

    def load_state_dict(self, state: dict) -> None:
        """Resume at the saved global position (O(1)); checks the stream definition is the same."""
        if state.get("version") != STATE_VERSION:
            raise DataError(f"data state: version {state.get('version')!r}, expected {STATE_VERSION}")
        mine = self.state_dict()
        for key in ("seed", "shuffle", "window", "corpus"):
            if state.get(key) != mine[key]:
                raise DataError(f"data state: {key} {state.get(key)!r} differs from this reader's "
                                f"{mine[key]!r} (resuming would not continue the same stream)")
        self.position = int(state["position"])
        self.sequences_consumed = int(state["sequences_consumed"])
        self.tokens_consumed = int(state["tokens_consumed"])

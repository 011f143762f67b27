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
the same masks whatever the rank layout. `set_mask_prob` changes the rate of the batches that follow
(a stage's mask_prob); a sequence's masks are a function of (seed, its index, the rate in force), so a
resume that sets the rate of the stage it resumes in hands out exactly the batches of the first run.

Named sources (data_pipeline/prepare.py). Each source has its own stream (its documents' own
per-epoch order, its own lanes, its own span history). Global sequence n is drawn from a source by a
counter-based draw: u_n, uniform in [0, 1) from (seed, MIX_KEY, n // 4096), picks the source whose
interval of the cumulative shares holds it (`set_mixture`; a share of 0 is an empty interval, never
drawn). The source's m-th sequence reads lane m mod K_s of that source, as above. So the global
stream depends on n and the mixture in force only, never on the rank layout or how sequences are
grouped into batches; the state adds each source's sequence count and span history (its position),
enough to resume exactly wherever the mixture changed. With one source every sequence is drawn from
it and m = n: the stream is exactly the pooled one above.
"""
from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Iterable, Iterator, Mapping

import numpy as np
import torch

from data_pipeline.config import MIN_SEQ_LEN
from data_pipeline.documents import DocumentView, document_positions
from data_pipeline.errors import DataError
from data_pipeline.masking import IGNORE_INDEX, MaskingConfig, mask_tokens, masked_positions, masked_slots
from data_pipeline.shards import Corpus
from data_pipeline.stream import SpanHistory, TokenStream

STATE_FORMAT = 2
STATE_ORDER = "global order (per-epoch permutation of all documents, read through lanes)"
_OLD_FORMATS = {1: "shard-window order (shards permuted per epoch, documents shuffled in 1024-document windows)"}
_MASK_KEY = 0x4D41534B
_MIX_KEY = 0x4D4958  # the source draws' RNG stream, apart from masking's and the document order's
_DRAW_BLOCK = 4096  # draws generated per RNG call (sequence n uses block n // _DRAW_BLOCK)

MixtureSpec = Mapping[str, float] | Iterable[tuple[str, float]] | None
"""{source: weight} or (source, weight) pairs; weights >= 0, normalised; a source not named gets 0;
None = the sources in proportion to their train tokens."""


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
                 max_epochs: int | None = None, order: str = "global", shard_window: int = 8):
        if world_size < 1 or not 0 <= rank < world_size:
            raise DataError(f"rank/world_size: rank {rank} is not in [0, {world_size})")
        if max_epochs is not None and max_epochs < 1:
            raise DataError(f"max_epochs: {max_epochs} must be >= 1")
        self.corpus, self.rank, self.world_size, self.seed = corpus, rank, world_size, int(seed)
        self.masking = masking or MaskingConfig()
        self._base_masking = self.masking  # the run config's: what set_mask_prob(None) returns to
        self.stream = TokenStream(corpus, self.seed, shuffle=shuffle, lanes=lanes, max_epochs=max_epochs,
                                  order=order, shard_window=shard_window)
        """The whole split's stream: validation reads it, and it is the training stream of one source."""
        self._word_starts = corpus.word_starts() if self.masking.whole_word else None
        self.special = corpus.special_ids
        """The corpus's special ids (manifest): [CLS] first, [PAD] after the end, never masked."""
        self.sequences_consumed = 0
        """Global count of sequences handed out (all ranks together); also the masking and draw key."""
        self.spans = SpanHistory()
        """Units per sequence (seq_len - 1) since which sequence: where every lane has got to."""
        self.source_names = corpus.source_names
        """The data's named sources in manifest order (one, 'default', for plain --input data)."""
        self._stream_options = {"shuffle": shuffle, "lanes": lanes, "max_epochs": max_epochs, "order": order,
                                "shard_window": shard_window}
        self._source_streams: list[TokenStream] | None = [self.stream] if len(self.source_names) == 1 else None
        self.source_sequences = np.zeros(len(self.source_names), dtype=np.int64)
        """Global count of sequences drawn from each source."""
        self.source_spans = [SpanHistory() for _ in self.source_names]
        """Each source's span history over its own sequences."""
        self.source_tokens = [corpus.source_corpus(name).tokens for name in self.source_names]
        """Tokens of each source in this split: the default mixture's weights."""
        self.last_tokens_by_source: dict[str, int] = {}
        """Non-padding tokens of the last global batch (all ranks) per source, counted on the host."""
        self._draw_block: tuple[int, np.ndarray] | None = None
        self.document_view = DocumentView()
        """What the batches carry about their documents (`set_document_view`)."""
        self.set_mixture(None)

    @property
    def source_streams(self) -> list[TokenStream]:
        """Each source's stream (built on first use: validation readers never need them)."""
        if self._source_streams is None:
            self._source_streams = [
                TokenStream(self.corpus.source_corpus(name), self.seed, order_key=zlib.crc32(name.encode()),
                            **self._stream_options) if tokens else None
                for name, tokens in zip(self.source_names, self.source_tokens)]
        return self._source_streams

    def set_mixture(self, mixture: MixtureSpec) -> None:
        """The share of each source in the sequences drawn from now on (a stage's `mixture`).

        None: in proportion to each source's train tokens. DataError (one line) for an unknown source,
        a negative weight, all weights 0, or a weight on a source with no documents in this split.
        """
        if mixture is None:
            weights = np.asarray(self.source_tokens, dtype=np.float64)
        else:
            given = dict(mixture)
            unknown = [name for name in given if name not in self.source_names]
            if unknown:
                raise DataError(f"mixture: unknown source {unknown[0]!r} (the data at {self.corpus.data_dir} has "
                                f"{', '.join(self.source_names)})")
            weights = np.asarray([float(given.get(name, 0.0)) for name in self.source_names], dtype=np.float64)
            if (weights < 0).any() or not np.isfinite(weights).all() or not weights.sum() > 0:
                raise DataError(f"mixture: weights {given} must be >= 0 with at least one > 0")
            empty = [name for name, w, t in zip(self.source_names, weights, self.source_tokens) if w > 0 and not t]
            if empty:
                raise DataError(f"mixture: source {empty[0]!r} has no documents in the {self.corpus.split} split")
        self.shares = weights / weights.sum()
        """Share of each source (in source_names order) in the sequences drawn now."""
        edges = np.cumsum(self.shares)
        edges[int(np.flatnonzero(self.shares > 0)[-1]):] = 2.0  # rounding never reaches a 0-share tail
        self._edges = edges

    def _draws(self, first: int, count: int) -> np.ndarray:
        """(count,) source index of global sequences first .. first + count - 1."""
        if len(self.source_names) == 1:
            return np.zeros(count, dtype=np.int64)
        n = np.arange(first, first + count, dtype=np.int64)
        u = np.empty(count, dtype=np.float64)
        for block in np.unique(n // _DRAW_BLOCK):
            if self._draw_block is None or self._draw_block[0] != block:
                rng = np.random.default_rng([self.seed, _MIX_KEY, int(block)])
                self._draw_block = (int(block), rng.random(_DRAW_BLOCK))
            inside = n // _DRAW_BLOCK == block
            u[inside] = self._draw_block[1][n[inside] % _DRAW_BLOCK]
        return np.searchsorted(self._edges, u, side="right").astype(np.int64)

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
        return self.position // self.stream.epoch_units

    def set_mask_prob(self, mask_prob: float | None) -> None:
        """Mask this share of tokens in the batches handed out from now on (the 80/10/10 split and
        whole-word choice stay); None = the rate this reader was built with. Not part of the state:
        the caller sets it again on resume (the trainer does at every stage switch)."""
        self.masking = self._base_masking if mask_prob is None else \
            dataclasses.replace(self._base_masking, mask_prob=float(mask_prob))  # validated: DataError outside (0, 1)

    def set_document_view(self, view: DocumentView) -> None:
        """Batches handed out from now on carry `document_ids` / `position_ids` as `view` says. Not part of
        the state (it changes no token, mask or position in the stream): the caller sets it on resume."""
        self.document_view = view

    def check_min_size(self, seq_len: int, global_batch: int) -> None:
        """DataError unless one epoch holds at least one global batch of `global_batch` x seq_len."""
        need = global_batch * (seq_len - 1)
        if self.stream.epoch_length < need:
            raise DataError(f"{self.corpus.data_dir / self.corpus.split}: corpus has "
                            f"{self.stream.epoch_length} tokens (with [SEP]s), fewer than one global batch "
                            f"of {global_batch} sequences x {seq_len - 1} tokens = {need}")

    def next_batch(self, seq_len: int, micro_batch_size: int) -> dict[str, torch.Tensor] | None:
        """This rank's micro-batch of the next global batch; None once a max_epochs stream is over.

        input_ids (B, T) long, attention_mask (B, T) long, labels (B, T) long (-100 = ignore),
        masked_positions (B, K) long: each row's labelled positions ascending, then -1 (NO_POSITION); K is
        `masking.masked_slots` of (T, mask_prob), one shape for a stage. With the document view's
        'document' attention also document_ids (B, T), with its 'document' positions position_ids (B, T)
        (data_pipeline/documents.py).
        """
        if seq_len < MIN_SEQ_LEN:
            raise DataError(f"seq_len: {seq_len} must be >= {MIN_SEQ_LEN} ([CLS] plus at least one token)")
        if micro_batch_size < 1:
            raise DataError(f"micro_batch_size: {micro_batch_size} must be >= 1")
        if self._stream_over():
            return None
        first = self.sequences_consumed + self.rank * micro_batch_size  # this rank's first global sequence
        draws, lanes, offsets, lengths = self._advance(seq_len - 1, self.world_size * micro_batch_size)
        self.last_tokens_by_source = {name: int((lengths[draws == s] + (lengths[draws == s] > 0)).sum())
                                      for s, name in enumerate(self.source_names)}  # [CLS] + units
        mine = range(self.rank * micro_batch_size, (self.rank + 1) * micro_batch_size)
        rows = [self.source_streams[draws[i]].read_lane(int(lanes[i]), int(offsets[i]), seq_len - 1) for i in mine]
        for stream in self.source_streams:
            if stream is not None:
                stream.end_batch()
        return self._build(rows, first, seq_len)

    def next_batches(self, seq_len: int, micro_batch_size: int, count: int) -> tuple[list, dict[str, int]]:
        """`count` successive micro-batches (one optimizer step's gradient accumulation) and the
        non-padding tokens they drew from each source over all ranks ({source: tokens}, every source)."""
        batches, drawn = [], dict.fromkeys(self.source_names, 0)
        for _ in range(count):
            batches.append(self.next_batch(seq_len, micro_batch_size))
            for name, tokens in self.last_tokens_by_source.items():
                drawn[name] += tokens
        return batches, drawn

    def skip(self, seq_len: int, sequences: int) -> None:
        """Pass over the next `sequences` global sequences of `seq_len` as if they had been handed out
        (the numerics guard's rewind past a stretch of bad data): their source draws and every source's
        lanes move as next_batch would move them, nothing is read. Only the position moves, so the skip is
        part of the state: a resume from any later checkpoint continues the same stream."""
        if seq_len < MIN_SEQ_LEN:
            raise DataError(f"seq_len: {seq_len} must be >= {MIN_SEQ_LEN} ([CLS] plus at least one token)")
        if sequences < 0:
            raise DataError(f"sequences: {sequences} must be >= 0")
        if sequences:
            self._advance(seq_len - 1, sequences)

    def _advance(self, span: int, count: int) -> tuple[np.ndarray, ...]:
        """Move the position past the next `count` global sequences of `span` units each: every sequence's
        source (drawn on every rank: cheap arithmetic) and its index m among that source's sequences give
        its lane and offset there. Returns (draws, lanes, offsets, lengths), each (count,)."""
        self.spans.record(self.sequences_consumed, span)
        draws = self._draws(self.sequences_consumed, count)
        m = np.empty(count, dtype=np.int64)
        lanes, offsets, lengths = (np.empty(count, dtype=np.int64) for _ in range(3))
        for s in np.unique(draws):
            stream, history, mine = self.source_streams[s], self.source_spans[s], draws == s
            history.record(int(self.source_sequences[s]), span)
            m[mine] = self.source_sequences[s] + np.arange(int(mine.sum()))
            lanes[mine] = m[mine] % stream.lanes
            offsets[mine] = history.lane_offsets(lanes[mine], m[mine], stream.lanes)
            ends = None if stream.lane_ends is None else stream.lane_ends[lanes[mine]]
            lengths[mine] = span if ends is None else np.clip(ends - offsets[mine], 0, span)
            self.source_sequences[s] += int(mine.sum())
        self.sequences_consumed += count
        return draws, lanes, offsets, lengths

    def _stream_over(self) -> bool:
        """True when every lane of every drawn source's max_epochs stream is used up (the same answer on
        every rank); a used-up source drawn before then gives an all-padding row."""
        if self.stream.lane_ends is None:
            return False
        for s in np.flatnonzero(self.shares > 0):
            stream = self.source_streams[s]
            lanes = np.arange(stream.lanes)
            offsets = self.source_spans[s].lane_offsets(lanes, int(self.source_sequences[s]), stream.lanes)
            if not (offsets >= stream.lane_ends).all():
                return False
        return True

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
            self.stream.end_batch()
            yield self._build(rows, first, seq_len)
            produced += 1
        self.stream.release_all()

    def _build(self, rows: list[np.ndarray], first_index: int, seq_len: int) -> dict[str, torch.Tensor]:
        """Pack `rows` (units after [CLS]; row i is global sequence first_index + i) and mask them."""
        input_ids = np.full((len(rows), seq_len), self.special.pad_token, dtype=np.int64)  # (B, T)
        labels = np.full((len(rows), seq_len), IGNORE_INDEX, dtype=np.int64)  # (B, T)
        attention = np.zeros((len(rows), seq_len), dtype=np.int64)  # (B, T)
        document_ids = np.zeros((len(rows), seq_len), dtype=np.int64)  # (B, T)
        for row, units in enumerate(rows):
            if len(units) == 0:
                continue  # past the end of the stream: an all-padding row, ignored by the loss
            seq = np.concatenate([[self.special.cls_token], units])
            rng = np.random.default_rng([self.seed, _MASK_KEY, first_index + row])
            corrupted, seq_labels = mask_tokens(seq, rng, self.masking, self.corpus.vocab_size,
                                                self._word_starts, self.special)
            n = len(seq)
            # the [SEP]s before a token: [CLS] joins the first document, a [SEP] the one it closes
            is_sep = seq == self.special.sep_token
            document_ids[row, :n] = np.cumsum(is_sep) - is_sep
            document_ids[row, n:] = document_ids[row, n - 1] + 1  # padding: a document of its own
            input_ids[row, :n] = corrupted
            labels[row, :n] = seq_labels
            attention[row, :n] = 1
        slots = masked_slots(seq_len, self.masking.mask_prob, int((labels != IGNORE_INDEX).sum(axis=1).max()))
        batch = {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(attention),
                 "labels": torch.from_numpy(labels),
                 "masked_positions": torch.from_numpy(masked_positions(labels, slots))}
        if self.document_view.attention == "document":
            batch["document_ids"] = torch.from_numpy(document_ids)
        if self.document_view.positions == "document":
            batch["position_ids"] = torch.from_numpy(document_positions(document_ids))
        return batch

    def state_dict(self) -> dict:
        """JSON-serializable global state; the same on every rank. With several sources it adds
        `sources` (each source's sequence count, span history and lanes: its position) and `mixture`
        (the shares in force; informative, each stage's switch sets its own). One source's position is
        the global one, so its state is exactly that of data without named sources."""
        state = {"format": STATE_FORMAT, "sequences_consumed": self.sequences_consumed,
                 "tokens_consumed": self.tokens_consumed, "spans": [list(s) for s in self.spans.segments],
                 "seed": self.seed, "shuffle": self.stream.shuffle, "lanes": self.stream.lanes,
                 "corpus": self.corpus.fingerprint}
        if self.stream.order != "global":  # a global-order state is exactly that of data before orders existed
            state.update(order=self.stream.order, shard_window=self.stream.shard_window)
        if len(self.source_names) > 1:
            state["sources"] = {name: {"sequences": int(self.source_sequences[s]),
                                       "spans": [list(x) for x in self.source_spans[s].segments],
                                       "lanes": self._source_lanes(s)}
                                for s, name in enumerate(self.source_names)}
            state["mixture"] = {name: float(share) for name, share in zip(self.source_names, self.shares)}
        return state

    def _source_lanes(self, s: int) -> int:
        stream = self.source_streams[s]
        return 0 if stream is None else stream.lanes

    def check_state(self, state: dict) -> None:
        """DataError unless this reader can resume `state` exactly (format, stream definition, shape)."""
        check_state_format(state)
        mine = self.state_dict()
        for key, default in (("order", "global"), ("shard_window", None), ("seed", None), ("shuffle", None),
                             ("lanes", None), ("corpus", None)):
            if state.get(key, default) != mine.get(key, default):
                raise DataError(f"data state: {key} {state.get(key, default)!r} differs from this reader's "
                                f"{mine.get(key, default)!r} (resuming would not continue the same stream)")
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
        self._source_positions(state)

    def _source_positions(self, state: dict) -> list[tuple[int, SpanHistory]]:
        """Each source's (sequences, span history) in a checked state. A state without `sources` (saved
        before named sources) is the one source's: the global position."""
        sources = state.get("sources")
        if sources is None:
            if len(self.source_names) > 1:
                raise DataError(f"data state: no per-source positions, but the data has sources "
                                f"{', '.join(self.source_names)} (a state of another corpus)")
            return [(int(state["sequences_consumed"]), SpanHistory([list(s) for s in state["spans"]]))]
        if not isinstance(sources, dict) or list(sources) != self.source_names:
            names = list(sources) if isinstance(sources, dict) else sources
            raise DataError(f"data state: sources {names!r} differ from the data's {self.source_names}")
        positions = []
        for s, name in enumerate(self.source_names):
            entry = sources[name]
            sequences = entry.get("sequences") if isinstance(entry, dict) else None
            if not isinstance(sequences, int) or sequences < 0 or not isinstance(entry.get("spans"), list):
                raise DataError(f"data state: sources.{name} {entry!r} is not {{sequences, spans, lanes}}")
            if entry.get("lanes") != self._source_lanes(s):
                raise DataError(f"data state: sources.{name}.lanes {entry.get('lanes')!r} differs from this "
                                f"reader's {self._source_lanes(s)} (resuming would not continue the same stream)")
            history = SpanHistory([list(x) if isinstance(x, (list, tuple)) else x for x in entry["spans"]])
            try:
                history.check(sequences)
            except DataError as err:
                raise DataError(f"{err} (sources.{name})") from None
            positions.append((sequences, history))
        if sum(p[0] for p in positions) != state["sequences_consumed"]:
            raise DataError(f"data state: the sources' sequences add up to {sum(p[0] for p in positions)}, "
                            f"not sequences_consumed {state['sequences_consumed']}")
        return positions

    def load_state_dict(self, state: dict) -> None:
        """Resume at the saved global point (O(1)); checks the stream definition is the same."""
        self.check_state(state)
        positions = self._source_positions(state)
        self.spans = SpanHistory([list(s) for s in state["spans"]])
        self.sequences_consumed = int(state["sequences_consumed"])
        self.source_sequences = np.asarray([p[0] for p in positions], dtype=np.int64)
        self.source_spans = [p[1] for p in positions]

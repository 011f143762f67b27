"""data.order shard_window (data_pipeline/stream.py): documents shuffled within seeded windows of shards, the
windows in a seeded order per epoch; the same global stream at any world size, exact resume, every token once
per epoch, and at most two windows read (and held) at a time."""
from __future__ import annotations

import numpy as np
import pytest

from data_pipeline import DataError, PretrainBatches, open_corpus


@pytest.fixture(scope="module")
def corpus(tiny_data):
    return open_corpus(tiny_data, "train")


def reader(corpus, **kwargs):
    return PretrainBatches(corpus, seed=5, order="shard_window", shard_window=2, **kwargs)


def test_the_global_stream_is_the_same_at_any_world_size(corpus):
    one = reader(corpus)
    two = [reader(corpus, rank=r, world_size=2) for r in range(2)]
    for seq_len in (32, 32, 64, 16):
        whole = one.next_batch(seq_len, 4)
        halves = [r.next_batch(seq_len, 2) for r in two]
        assert (whole["input_ids"] == np.concatenate([h["input_ids"] for h in halves])).all()
        assert (whole["labels"] == np.concatenate([h["labels"] for h in halves])).all()


def test_a_resume_mid_stage_continues_exactly(corpus):
    first = reader(corpus, world_size=2)
    for _ in range(7):
        first.next_batch(32, 2)
    state = first.state_dict()
    assert state["order"] == "shard_window" and state["shard_window"] == 2
    resumed = reader(corpus, world_size=2)
    resumed.load_state_dict(state)
    for seq_len in (32, 64):
        a, b = first.next_batch(seq_len, 2), resumed.next_batch(seq_len, 2)
        assert all((a[k] == b[k]).all() for k in a)
    with pytest.raises(DataError, match="data state: order 'shard_window' differs from this reader's 'global'"):
        PretrainBatches(corpus, seed=5, world_size=2).load_state_dict(state)


def test_an_epoch_reads_the_windows_one_after_the_other_two_at_a_time(corpus):
    batches = reader(corpus, max_epochs=1)
    stream = batches.stream
    assert len(stream.windows) == 10 and sorted(np.concatenate(stream.windows)) == list(range(20))
    windows_read, real_tokens, rows = [], 0, 0
    while (batch := batches.next_batch(64, 4)) is not None:
        real_tokens += int(batch["attention_mask"].sum())
        rows += int((batch["attention_mask"].sum(dim=1) > 0).sum())
        windows_read.append(set(stream._touched_before))
        assert len(stream._held) <= 2
    assert real_tokens - rows == stream.epoch_units  # every unit of the epoch once ([CLS] of each row aside)
    order = [w for read in windows_read for w in sorted(read)]
    assert set(order) == set(range(10))
    # windows are read one after the other: once left, a window is not read again in the epoch
    first_seen = {w: order.index(w) for w in set(order)}
    last_seen = {w: len(order) - 1 - order[::-1].index(w) for w in set(order)}
    spans = sorted((first_seen[w], last_seen[w]) for w in first_seen)
    assert all(a[1] <= b[0] + 2 for a, b in zip(spans, spans[1:]))


def test_the_unmasked_epoch_holds_every_document_once(corpus):
    stream = reader(corpus, lanes=1).stream
    out = np.empty(stream.epoch_length, dtype=np.int64)
    stream.fill_from_epoch(0, 0, out)
    docs = [np.asarray(s.token_ids[s.offsets[i]:s.offsets[i + 1]]) for s in corpus.shards for i in range(s.documents)]
    pieces = [p[:-1] for p in np.split(out, np.flatnonzero(out == corpus.special_ids.sep_token) + 1)[:-1]]
    assert sorted(p.astype(np.int64).tobytes() for p in pieces) == sorted(d.astype(np.int64).tobytes() for d in docs)
    # the epoch's documents come window by window
    window_of = {k: w for w, members in enumerate(stream.windows) for k in members}
    perm = stream._order(0)[0]
    doc_window = [window_of[int(np.searchsorted(stream._shard_first_doc, d, side="right") - 1)] for d in perm]
    changes = sum(1 for a, b in zip(doc_window, doc_window[1:]) if a != b)
    assert changes == len(stream.windows) - 1


def test_global_order_keeps_its_state_format(corpus):
    state = PretrainBatches(corpus, seed=5).state_dict()
    assert "order" not in state and "shard_window" not in state

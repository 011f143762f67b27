"""Streaming reader: exact resume, rank split and coverage, masking statistics, flat memory."""
from __future__ import annotations

import json
import tracemalloc
from collections import Counter

import numpy as np
import pytest
import torch

from data_pipeline import DataError, MaskingConfig, PretrainBatches, open_corpus
from data_pipeline.config import CLS_ID, MASK_ID, NUM_SPECIAL_IDS, PAD_ID, SEP_ID
from tests.support.corpus_files import prepared_dir

# (steps, seq_len, micro_batch): the stage schedule changes both mid-run.
SCHEDULE = [(5, 64, 2), (6, 32, 3)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return open_corpus(prepared_dir(tmp_path_factory), "train")


def make_ranks(corpus, world_size, seed=7, **kw):
    return [PretrainBatches(corpus, rank=r, world_size=world_size, seed=seed, **kw) for r in range(world_size)]


def global_batch(ranks, seq_len, mb):
    """Concatenate the ranks' micro-batches in rank order: the global batch."""
    parts = [r.next_batch(seq_len, mb) for r in ranks]
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def run_schedule(ranks, schedule):
    out = []
    for steps, seq_len, mb in schedule:
        out.extend(global_batch(ranks, seq_len, mb) for _ in range(steps))
    return out


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for k in ("input_ids", "attention_mask", "labels"):
            assert torch.equal(x[k], y[k]), k


def test_exact_resume_two_ranks_with_seq_len_change_at_resume_point(corpus):
    reference = run_schedule(make_ranks(corpus, 2), SCHEDULE)
    first = make_ranks(corpus, 2)
    before = run_schedule(first, SCHEDULE[:1])  # stop right where seq_len and micro-batch change
    states = [json.loads(json.dumps(r.state_dict())) for r in first]
    assert states[0] == states[1]  # the position is global
    resumed = make_ranks(corpus, 2)
    for r, s in zip(resumed, states):
        r.load_state_dict(s)
    after = run_schedule(resumed, SCHEDULE[1:])
    assert_same(reference, before + after)
    assert resumed[0].sequences_consumed == 5 * 4 + 6 * 6
    assert resumed[0].tokens_consumed == 5 * 4 * 64 + 6 * 6 * 32


def test_resume_with_a_different_world_size_continues_the_same_global_stream(corpus):
    reference = run_schedule(make_ranks(corpus, 2), [(4, 48, 2), (4, 48, 2)])
    first = make_ranks(corpus, 2)
    before = run_schedule(first, [(4, 48, 2)])
    four = make_ranks(corpus, 4)  # same global batch of 4 sequences, one per rank
    for r in four:
        r.load_state_dict(first[0].state_dict())
    after = run_schedule(four, [(4, 48, 1)])
    assert_same(reference, before + after)


def test_shuffle_depends_on_seed_and_epoch(corpus):
    a = make_ranks(corpus, 1, seed=1)[0].next_batch(64, 4)["labels"]
    b = make_ranks(corpus, 1, seed=2)[0].next_batch(64, 4)["labels"]
    assert not torch.equal(a, b)
    unshuffled = make_ranks(corpus, 1, shuffle=False)[0]
    first_shard = np.asarray(corpus.shards[0].token_ids[:63])
    ids = original_ids(unshuffled.next_batch(64, 1))[0]
    assert ids[0] == CLS_ID and np.array_equal(ids[1:], first_shard)


def original_ids(batch) -> np.ndarray:
    """Undo the masking: labels hold the original id wherever a token was chosen."""
    ids, labels = batch["input_ids"].numpy(), batch["labels"].numpy()
    return np.where(labels != -100, labels, ids)


@pytest.mark.parametrize("world_size", [3])
def test_ranks_cover_every_token_once_per_epoch_without_overlap(corpus, world_size):
    # 20 uneven shards over 3 ranks: not divisible, and shards differ in size by 10x.
    assert len(corpus.shards) % world_size != 0
    ranks = make_ranks(corpus, world_size, max_epochs=1)
    assert ranks[0].stream.lanes > world_size * 2  # a global batch takes different lanes
    seen = [Counter() for _ in ranks]
    steps = [0] * world_size
    seq_len, mb = 40, 2
    while True:
        batches = [r.next_batch(seq_len, mb) for r in ranks]
        done = [b is None for b in batches]
        assert len(set(done)) == 1  # every rank stops at the same step
        if done[0]:
            break
        for i, b in enumerate(batches):
            steps[i] += 1
            ids = original_ids(b)[b["attention_mask"].numpy() == 1]
            seen[i].update(ids[ids >= NUM_SPECIAL_IDS].tolist())
            assert b["input_ids"].shape == (mb, seq_len)
    expected = Counter()
    for shard in corpus.shards:
        expected.update(np.asarray(shard.token_ids).tolist())
    total = sum(seen, Counter())
    assert total == Counter({k: v for k, v in expected.items() if k >= NUM_SPECIAL_IDS})
    assert len(set(steps)) == 1 and steps[0] > 10
    # Each [SEP] closes one document, plus one closing each lane's part of the epoch.
    sep_count = 0
    for r in make_ranks(corpus, world_size, max_epochs=1):
        while (b := r.next_batch(seq_len, mb)) is not None:
            sep_count += int((original_ids(b) == SEP_ID).sum())
    assert sep_count == corpus.documents + ranks[0].stream.lanes


def test_padding_only_in_the_last_round_of_lanes(corpus):
    reader = make_ranks(corpus, 1, max_epochs=1)[0]
    seq_len, mb = 128, 4
    pads = []
    while (b := reader.next_batch(seq_len, mb)) is not None:
        pads.append(int((b["attention_mask"] == 0).sum()))
    # Lanes differ in length by at most one unit and are read in turn, so all of them run out within
    # two rounds of K sequences: padding appears in those last steps only.
    last_rounds = 2 * -(-reader.stream.lanes // mb) + 1
    first_padded = next(i for i, p in enumerate(pads) if p > 0)
    assert len(pads) > 4 * last_rounds
    assert first_padded >= len(pads) - last_rounds and pads[-1] > 0
    endless = make_ranks(corpus, 1)[0]
    for _ in range(len(pads) + 3):  # crosses into epoch 1 without padding
        assert int(endless.next_batch(seq_len, mb)["attention_mask"].min()) == 1
    assert endless.epoch == 1


def test_masking_statistics_and_special_tokens_never_masked(corpus):
    reader = make_ranks(corpus, 1)[0]
    chosen = maskable = as_mask = unchanged = 0
    for _ in range(60):
        b = reader.next_batch(128, 8)
        orig, ids, labels = original_ids(b), b["input_ids"].numpy(), b["labels"].numpy()
        special = orig < NUM_SPECIAL_IDS
        assert (labels[special] == -100).all()
        assert np.array_equal(ids[special], orig[special])  # specials are never corrupted
        assert (ids[:, 0] == CLS_ID).all()
        picked = labels != -100
        chosen += picked.sum()
        maskable += (~special).sum()
        as_mask += (ids[picked] == MASK_ID).sum()
        unchanged += (ids[picked] == labels[picked]).sum()
        assert (ids[~picked & ~special] >= NUM_SPECIAL_IDS).all()  # random replacements are not special
    assert abs(chosen / maskable - 0.15) < 0.005
    assert abs(as_mask / chosen - 0.8) < 0.02
    # unchanged = the 10% kept + the rare random draw equal to the original (1/vocab).
    assert abs(unchanged / chosen - 0.1) < 0.015
    random_share = 1 - as_mask / chosen - unchanged / chosen
    assert abs(random_share - 0.1) < 0.015


def test_whole_word_masking_keeps_words_together(corpus):
    reader = make_ranks(corpus, 1, masking=MaskingConfig(whole_word=True))[0]
    starts_table = corpus.word_starts()
    multi_piece_words_masked = 0
    chosen = maskable = 0
    for _ in range(30):
        b = reader.next_batch(96, 8)
        for orig, labels in zip(original_ids(b), b["labels"].numpy()):
            maskable_pos = orig >= NUM_SPECIAL_IDS
            prev = np.concatenate([[False], maskable_pos[:-1]])
            starts = maskable_pos & (starts_table[orig] | ~prev)
            word = np.cumsum(starts)
            picked = labels != -100
            for w in np.unique(word[maskable_pos]):
                members = maskable_pos & (word == w)
                assert picked[members].all() or not picked[members].any()
                multi_piece_words_masked += int(picked[members].all() and members.sum() > 1)
            chosen += picked.sum()
            maskable += maskable_pos.sum()
    assert multi_piece_words_masked > 50
    assert abs(chosen / maskable - 0.15) < 0.02


def test_eval_batches_are_repeatable_and_leave_state_alone(tmp_path_factory):
    valid = open_corpus(prepared_dir(tmp_path_factory), "valid")
    reader = PretrainBatches(valid, seed=3, shuffle=False)
    first = list(reader.iter_eval_batches(64, 4, max_batches=3))
    again = list(reader.iter_eval_batches(64, 4, max_batches=3))
    assert len(first) == 3
    assert_same(first, again)
    assert reader.position == 0 and reader.sequences_consumed == 0
    whole = list(reader.iter_eval_batches(64, 4))
    real = sum(int(b["attention_mask"].sum()) - int((b["input_ids"][:, 0] == CLS_ID).sum()) for b in whole)
    assert real == valid.tokens + valid.documents  # one pass: every token and [SEP], nothing twice


def test_reader_memory_stays_flat(corpus):
    reader = make_ranks(corpus, 1)[0]
    for _ in range(20):
        reader.next_batch(128, 16)
    tracemalloc.start()
    for _ in range(100):
        reader.next_batch(128, 16)
    early_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.reset_peak()
    for _ in range(400):  # several epochs of this corpus
        reader.next_batch(128, 16)
    late_current, late_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert reader.epoch >= 3
    assert late_peak < early_peak + 512 * 1024
    assert late_current < 4 * 1024 * 1024


def test_bad_state_and_arguments_are_rejected(corpus):
    reader = make_ranks(corpus, 1, seed=1)[0]
    other = make_ranks(corpus, 1, seed=2)[0]
    with pytest.raises(DataError, match="seed"):
        reader.load_state_dict(other.state_dict())
    with pytest.raises(DataError, match="seq_len"):
        reader.next_batch(1, 4)
    with pytest.raises(DataError, match="rank"):
        PretrainBatches(corpus, rank=2, world_size=2)
    with pytest.raises(DataError, match="fewer than one global batch"):
        reader.check_min_size(seq_len=512, global_batch=10_000)
    reader.check_min_size(seq_len=128, global_batch=16)
    assert PAD_ID == 0


def test_each_epoch_has_its_own_order_and_seeking_far_is_immediate(corpus):
    import time

    reader = make_ranks(corpus, 1)[0]
    stream, length = reader.stream, reader.stream.epoch_length

    def epoch_units(epoch):
        out = np.empty(length, dtype=np.int64)
        stream.fill_from_epoch(epoch, 0, out)
        return out

    assert not np.array_equal(epoch_units(0)[:500], epoch_units(1)[:500])
    # Same multiset of units in every epoch (shuffled, nothing lost or added).
    assert np.array_equal(np.sort(epoch_units(0)), np.sort(epoch_units(1)))
    sequences = 10**9
    far = dict(reader.state_dict(), spans=[[0, 127]], sequences_consumed=sequences,
               tokens_consumed=sequences * 128)
    start = time.perf_counter()
    reader.load_state_dict(far)
    batch = reader.next_batch(128, 4)
    assert time.perf_counter() - start < 2.0  # reading through the epochs before would take hours
    assert reader.epoch == sequences * 127 // (length + stream.lanes) > 1000
    twin = make_ranks(corpus, 1)[0]
    twin.load_state_dict(far)
    assert_same([batch], [twin.next_batch(128, 4)])

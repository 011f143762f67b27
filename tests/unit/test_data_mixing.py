"""Global mixing of the training stream: every global batch is a sample of the whole corpus.

Corpus: four generated sources written as four input files (one source each, so tiny shards are
single-source and input order groups sources), each with its own alphabet, hence its own tokens
(SentencePiece trained by the real `prepare`): a token's source is read off its piece. The sources
differ in share and in document length, and one of them holds documents far longer than a sequence.

Tolerance. A global batch of G sequences takes G different lanes, i.e. G places of a random document
order. Take each sequence's share Y_i of source k as one draw: Y_i in [0, 1] with mean p_k (the
corpus share), so Var(Y_i) <= p_k (1 - p_k) (equality when a sequence is all one document), and the
batch share, the mean of G such draws taken without replacement, has standard deviation at most
sqrt(p_k (1 - p_k) / G): the binomial bound with G trials. The test allows z of those, with z the
two-sided normal quantile for a 1% chance of any false alarm over all (batch, source) checks
(Bonferroni): z ~= 4.3 here.
"""
from __future__ import annotations

import json
import random
from collections import Counter
from statistics import NormalDist

import numpy as np
import pytest
import torch

from data_pipeline import DataError, PretrainBatches, check_state_format, open_corpus
from data_pipeline.config import (
    NUM_SPECIAL_IDS,
    SEP_ID,
    CleaningConfig,
    InputConfig,
    PrepareConfig,
    TokenizerConfig,
)
from data_pipeline.prepare import prepare
from tests.support.token_sources import token_source_table
from tests.unit.test_data_batches import assert_same, original_ids

ALPHABETS = ("abcdef", "ghijkl", "mnopqr", "stuvwx")
# (documents, words per document: low, high) per source: shares ~ 0.42 / 0.27 / 0.19 / 0.12 of tokens.
SOURCES = ((100, 900, 2400), (5000, 4, 40), (1000, 40, 160), (1200, 10, 90))
SHARD_TOKENS = 4000  # tiny shards: ~150 of them, each from a single source
FAMILY_ALPHA = 0.01
# (steps, seq_len, micro_batch, world_size) of one epoch-long run: seq_len, micro-batch and world
# size change mid-epoch, as at stage boundaries.
SCHEDULE = [(100, 32, 16, 4), (1000, 64, 16, 2)]


def generated_documents(source: int, rng: random.Random) -> list[str]:
    """Zipf-distributed words over the source's own 200-word vocabulary (letters of its alphabet)."""
    letters = ALPHABETS[source]
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 7))) for _ in range(200)]
    weights = [1 / (rank + 1) for rank in range(len(words))]
    count, low, high = SOURCES[source]
    documents = []
    for _ in range(count):
        text = rng.choices(words, weights, k=rng.randint(low, high))
        # Lines of 60 words: SentencePiece skips training lines over 4192 bytes.
        documents.append("\n".join(" ".join(text[i:i + 60]) for i in range(0, len(text), 60)))
    return documents


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    raw = tmp_path_factory.mktemp("mixing_raw")
    rng = random.Random(2024)
    for source in range(len(ALPHABETS)):
        with open(raw / f"source{source}.jsonl", "w", encoding="utf-8") as f:
            for text in generated_documents(source, rng):
                f.write(json.dumps({"text": text}) + "\n")
    out = tmp_path_factory.mktemp("mixing_prepared")
    cfg = PrepareConfig(input=InputConfig(inputs=[str(raw / f"source{s}.jsonl") for s in range(4)]), out_dir=out,
                        tokenizer=TokenizerConfig(vocab_size=600, character_coverage=1.0),
                        cleaning=CleaningConfig(valid_fraction=0.02), shard_tokens=SHARD_TOKENS)
    prepare(cfg, log=lambda msg: None)
    return open_corpus(out, "train")


@pytest.fixture(scope="module")
def source_of(corpus):
    """(V,) source of each token id; -1 for special ids and pieces without letters (a lone '▁')."""
    return token_source_table(corpus, ALPHABETS)


def corpus_shares(corpus, source_of) -> np.ndarray:
    counts = np.zeros(len(ALPHABETS))
    for shard in corpus.shards:
        sources = source_of[np.asarray(shard.token_ids)]
        counts += np.bincount(sources[sources >= 0], minlength=len(ALPHABETS))
    return counts / counts.sum()


def global_batches(corpus, schedule, **kw):
    """Global batches of a run following `schedule`, assembled from every rank in rank order."""
    out = []
    for steps, seq_len, mb, world in schedule:
        if not out:
            ranks = [PretrainBatches(corpus, rank=r, world_size=world, seed=11, **kw) for r in range(world)]
        elif world != len(ranks):  # a new world size resumes from the saved global state
            state = json.loads(json.dumps(ranks[0].state_dict()))
            ranks = [PretrainBatches(corpus, rank=r, world_size=world, seed=11, **kw) for r in range(world)]
            for r in ranks:
                r.load_state_dict(state)
        for _ in range(steps):
            parts = [r.next_batch(seq_len, mb) for r in ranks]
            if parts[0] is None:
                return out
            out.append({k: torch.cat([p[k] for p in parts]) for k in parts[0]})
    return out


def tolerance(shares: np.ndarray, sequences: int, checks: int) -> np.ndarray:
    z = NormalDist().inv_cdf(1 - FAMILY_ALPHA / (2 * checks))
    return z * np.sqrt(shares * (1 - shares) / sequences)


def worst_share_deviation(batches, shares, source_of) -> tuple[float, float]:
    """(largest |batch share - corpus share| / tolerance, that deviation) over every batch and source."""
    checks = len(batches) * len(shares)
    worst = (0.0, 0.0)
    for b in batches:
        ids = original_ids(b)[b["attention_mask"].numpy() == 1]
        sources = source_of[ids]
        counts = np.bincount(sources[sources >= 0], minlength=len(shares))
        deviation = np.abs(counts / counts.sum() - shares)
        ratio = deviation / tolerance(shares, len(b["input_ids"]), checks)
        k = int(ratio.argmax())
        worst = max(worst, (float(ratio[k]), float(deviation[k])))
    return worst


def test_every_global_batch_is_a_sample_of_the_whole_corpus(corpus, source_of):
    shares = corpus_shares(corpus, source_of)
    assert shares.min() > 0.1 and len(corpus.shards) > 100
    batches = global_batches(corpus, SCHEDULE)
    epoch_batches = (corpus.tokens + corpus.documents) // (64 * 31)
    assert len(batches) > epoch_batches  # the whole first epoch, across the seq_len change
    ratio, deviation = worst_share_deviation(batches, shares, source_of)
    print(f"corpus shares {np.round(shares, 3).tolist()}; {len(batches)} global batches; worst deviation "
          f"{deviation:.3f} = {ratio:.2f} x tolerance (64 sequences: "
          f"{np.round(tolerance(shares, 64, 4 * len(batches)), 3).tolist()})")
    assert ratio <= 1.0


def test_the_tolerance_catches_an_order_that_does_not_spread_long_documents(corpus, source_of):
    """Control: one lane (a document permutation read straight through) lets a document longer than a
    batch fill whole batches; the same check must fail it, or it would not be testing anything."""
    shares = corpus_shares(corpus, source_of)
    ratio, deviation = worst_share_deviation(global_batches(corpus, SCHEDULE[:1], lanes=1), shares, source_of)
    assert ratio > 1.5 and deviation > 0.5


def test_long_documents_stay_whole_within_their_lane_through_a_seq_len_change(corpus):
    """Concatenating the sequences of one lane, in order, gives that lane's part of the epoch order."""
    reader = PretrainBatches(corpus, seed=11)
    k = reader.stream.lanes
    per_lane = [[] for _ in range(k)]
    n = 0
    for seq_len, steps in ((48, 30), (200, 30)):
        for _ in range(steps):
            for row in original_ids(reader.next_batch(seq_len, 16)):
                per_lane[n % k].append(row[1:])  # drop [CLS]
                n += 1
    documents_crossed = 0
    for lane in range(k):
        got = np.concatenate(per_lane[lane])
        want = np.empty(len(got), dtype=np.int64)
        reader.stream.fill_from_epoch(0, int(reader.stream.lane_starts[lane]), want)
        assert np.array_equal(got, want)
        documents_crossed += int((got == SEP_ID).sum())
    assert documents_crossed > k  # lanes run through many documents, short and long


def test_each_token_once_per_epoch_through_stage_and_world_size_changes(corpus):
    batches = global_batches(corpus, SCHEDULE, max_epochs=1)
    seen = Counter()
    seps = 0
    for b in batches:
        ids = original_ids(b)[b["attention_mask"].numpy() == 1]
        seen.update(ids[ids >= NUM_SPECIAL_IDS].tolist())
        seps += int((ids == SEP_ID).sum())
    expected = Counter()
    for shard in corpus.shards:
        expected.update(np.asarray(shard.token_ids).tolist())
    assert seen == Counter({t: c for t, c in expected.items() if t >= NUM_SPECIAL_IDS})
    lanes = PretrainBatches(corpus).stream.lanes
    assert seps == corpus.documents + lanes  # one per document, one closing each lane's part


@pytest.mark.parametrize("stops", [(7, 61), (60, 150), (1, 2, 3, 97)])
def test_resume_at_any_step_equals_the_uninterrupted_stream(corpus, stops):
    """Stop at the given global steps (mid-stage and on the seq_len change), save, resume in a fresh reader."""
    schedule = [(60, 32, 8, 2), (40, 64, 4, 2), (60, 128, 2, 2)]
    plan = [(seq_len, mb) for steps, seq_len, mb, _ in schedule for _ in range(steps)]
    reference = global_batches(corpus, schedule)
    ranks = [PretrainBatches(corpus, rank=r, world_size=2, seed=11) for r in range(2)]
    resumed = []
    for step, (seq_len, mb) in enumerate(plan):
        if step in stops:
            state = json.loads(json.dumps(ranks[0].state_dict()))
            assert state == ranks[1].state_dict()
            ranks = [PretrainBatches(corpus, rank=r, world_size=2, seed=11) for r in range(2)]
            for r in ranks:
                r.load_state_dict(state)
        parts = [r.next_batch(seq_len, mb) for r in ranks]
        resumed.append({key: torch.cat([p[key] for p in parts]) for key in parts[0]})
    assert_same(reference, resumed)


def test_global_batches_do_not_depend_on_the_world_size(corpus):
    one = global_batches(corpus, [(12, 32, 16, 1), (12, 96, 8, 1)])
    two = global_batches(corpus, [(12, 32, 8, 2), (12, 96, 4, 2)])
    four = global_batches(corpus, [(12, 32, 4, 4), (12, 96, 2, 4)])
    assert_same(one, two)
    assert_same(one, four)


def old_format_state(reader) -> dict:
    """A data state exactly as format 1 (shard-window order) saved it."""
    return {"version": 1, "position": 123_456, "sequences_consumed": 1_000, "tokens_consumed": 128_000,
            "seed": reader.seed, "shuffle": True, "window": 1024, "corpus": reader.corpus.fingerprint}


def test_a_state_of_the_previous_format_is_refused_with_the_reason(corpus):
    reader = PretrainBatches(corpus, seed=11)
    expected = (r"^data state format 1 \(shard-window order.*\) cannot be resumed by format 2 \(global order"
                r".*\): its position counts units of the old order")
    with pytest.raises(DataError, match=expected) as err:
        reader.load_state_dict(old_format_state(reader))
    assert "\n" not in str(err.value)
    assert reader.sequences_consumed == 0 and reader.spans.segments == []  # nothing half-applied
    with pytest.raises(DataError, match=expected):
        check_state_format(old_format_state(reader))  # the launcher's check, before any compute
    with pytest.raises(DataError, match="format 3 is not 2"):
        check_state_format(dict(reader.state_dict(), format=3))
    check_state_format(reader.state_dict())


@pytest.mark.parametrize("change, message", [
    ({"lanes": 3}, "lanes 3 differs"),
    ({"spans": [[5, 31]]}, r"spans\[0\] \[5, 31\] is not"),
    ({"spans": [[0, 31], [0, 63]]}, r"spans\[1\]"),
    ({"tokens_consumed": 1}, "tokens_consumed 1 does not match"),
])
def test_inconsistent_states_are_refused(corpus, change, message):
    reader = PretrainBatches(corpus, seed=11)
    for _ in range(3):
        reader.next_batch(32, 4)
    with pytest.raises(DataError, match=message):
        PretrainBatches(corpus, seed=11).load_state_dict(dict(reader.state_dict(), **change))


def test_the_epoch_order_costs_about_four_bytes_per_document(corpus):
    """Per epoch: the permutation (int32) and the start of every 64th document (int64); nothing per token."""
    reader = PretrainBatches(corpus, seed=11)
    reader.next_batch(64, 4)
    perm, block_starts = reader.stream._order(0)
    assert perm.dtype == np.int32 and len(perm) == corpus.documents
    assert perm.nbytes + block_starts.nbytes <= 4.125 * corpus.documents + 8
    assert sorted(perm.tolist()) == list(range(corpus.documents))

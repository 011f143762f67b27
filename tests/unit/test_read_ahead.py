"""The training reader one step ahead (launcher/train/read_ahead.py): the stream is the one read without it, a
checkpoint taken while a step is read ahead resumes at that step with the same batches, and whatever moves the
reader first puts the read-ahead back. A real PretrainBatches over a prepared corpus."""
from __future__ import annotations

import pytest
import torch

from data_pipeline import DocumentView, PretrainBatches, open_corpus
from launcher.train.read_ahead import ReadAhead
from tests.support.corpus_files import prepared_dir

SHAPE = (32, 4, 2)  # seq_len, micro-batch, micro-batches per step


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return open_corpus(prepared_dir(tmp_path_factory), "train")


def ids(host: list[dict]) -> list[torch.Tensor]:
    return [torch.cat([b["input_ids"], b["labels"]]) for b in host]


def plain_steps(corpus, n: int, shape=SHAPE) -> list[list[torch.Tensor]]:
    reader = PretrainBatches(corpus, seed=0)
    return [ids(reader.next_batches(*shape)[0]) for _ in range(n)]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_reading_ahead_hands_out_the_stream_read_without_it(corpus):
    want = plain_steps(corpus, 5)
    reader = ReadAhead(PretrainBatches(corpus, seed=0))
    got = []
    for step in range(5):
        got.append(reader.step_batches(*SHAPE, ids).prepared)
        if step % 2 == 0:  # some steps read the next one ahead, as the trainer does inside a stage
            reader.read_ahead(*SHAPE, ids)
    assert all(same(g, w) for g, w in zip(got, want))


def test_a_checkpoint_while_a_step_is_read_ahead_resumes_at_that_step(corpus):
    reader = ReadAhead(PretrainBatches(corpus, seed=0))
    reader.step_batches(*SHAPE, ids)
    plain = PretrainBatches(corpus, seed=0)
    plain.next_batches(*SHAPE)
    reader.read_ahead(*SHAPE, ids)
    saved = reader.state_dict()
    assert saved == plain.state_dict()  # the position before the batches read ahead
    resumed = PretrainBatches(corpus, seed=0)
    resumed.load_state_dict(saved)
    assert same(ids(resumed.next_batches(*SHAPE)[0]), reader.step_batches(*SHAPE, ids).prepared)


@pytest.mark.parametrize("move", ["mask rate", "document view", "skip", "another shape", "load"])
def test_what_moves_the_reader_puts_the_read_ahead_back_first(corpus, move):
    reader = ReadAhead(PretrainBatches(corpus, seed=0))
    plain = PretrainBatches(corpus, seed=0)
    start = plain.state_dict()
    reader.read_ahead(*SHAPE, ids)
    other = (64, 2, 1)
    if move == "mask rate":
        reader.set_mask_prob(0.3), plain.set_mask_prob(0.3)
    elif move == "document view":
        view = DocumentView("document", "document")
        reader.set_document_view(view), plain.set_document_view(view)
    elif move == "skip":
        reader.skip(SHAPE[0], 3), plain.skip(SHAPE[0], 3)
    elif move == "load":
        reader.load_state_dict(start)
    shape = other if move == "another shape" else SHAPE
    assert same(reader.step_batches(*shape, ids).prepared, ids(plain.next_batches(*shape)[0]))
    assert reader.state_dict() == plain.state_dict()

"""Document attention end to end (issue 50): `data.attention: document` and `data.positions: document` reach the
model through the real trainer (the losses differ from the sequence run's on the same data), and a run stopped
mid-stage (a copy of the uninterrupted run trimmed to its checkpoint there; a stop by signal itself, and two runs of
one config agreeing to 1e-6: test_resume.py) and resumed at another world size continues the uninterrupted run's
losses."""
from __future__ import annotations

import pytest

from launcher.train.metrics import read_metrics
from tests.support.helpers import (
    NO_DROPOUT,
    TEST_RANK_ENTRY,
    TINY_TOTAL_STEPS,
    run_to_end,
    start_run,
    tiny_run_config,
    train_losses,
    trimmed_copy,
)

TIMEOUT = 240
DOCUMENTS = {"attention": "document", "positions": "document"}
STOPPED_AT = 8  # mid second stage (steps 7-10): a checkpoint every 4 steps, all six kept


def test_document_attention_reaches_the_model_and_resumes_at_another_world_size(tmp_path, tiny_data, trainer_run):
    config = tiny_run_config(tmp_path, tiny_data, model=NO_DROPOUT, data=DOCUMENTS, checkpoint={"keep_last": 6})
    reference = tmp_path / "reference"
    run_to_end(2, config, reference, module=TEST_RANK_ENTRY)
    expected = train_losses(reference)
    assert sorted(expected) == list(range(1, TINY_TOTAL_STEPS + 1))
    sequence = train_losses(trainer_run)  # the same data, seed and schedule with whole-sequence attention
    # a rerun of one config agrees to 1e-6 (test_resume); a tiny random model's losses move little with attention
    assert max(abs(expected[step] - sequence[step]) for step in expected) > 1e-5

    resumed = trimmed_copy(reference, tmp_path / "resumed", STOPPED_AT)
    proc = start_run(1, config, resumed, module=TEST_RANK_ENTRY)
    assert proc.wait(timeout=TIMEOUT) == 0, (tmp_path / "resumed.log").read_text()[-4000:]
    event = [r for r in read_metrics(resumed, "event") if r["event"] == "resume"][-1]
    assert (event["from_world_size"], event["world_size"]) == (2, 1)
    got = train_losses(resumed)
    assert sorted(got) == list(range(1, TINY_TOTAL_STEPS + 1))
    first_resumed = event["step"] + 1
    for step in range(1, first_resumed):  # before the stop: the same two ranks, the same sums
        assert abs(got[step] - expected[step]) <= 1e-6, step
    for step in range(first_resumed, TINY_TOTAL_STEPS + 1):  # other micro-batch split: other summation order
        assert got[step] == pytest.approx(expected[step], rel=1e-4, abs=1e-4), step

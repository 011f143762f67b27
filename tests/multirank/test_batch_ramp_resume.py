"""A batch ramp inside a stage with the LR scaled to the batch, in real runs (issue 51): the ramp's batches are
trained on one engine (grad-accum and micro-batch change, no stage switch: the stage-end validation runs only at
the real stage's end), and a 2-rank run stopped in the middle of the ramp and resumed at world size 1 gives the
uninterrupted run's losses, batches and learning rates.

The ramp: 4 -> 16 sequences in steps of 4 over the stage's first 6 steps (4, 4, 8, 8, 12, 12, then 16), at
length 32 under a 128-token micro-batch budget, so the split changes at every piece (2 ranks: micro 2, 4, 3, 4;
1 rank: 4 x 1, 2, 3, 4), then a second stage at another length. LR = the curve x (batch / 16) (linear).
"""
from __future__ import annotations

import shutil

import pytest

from launcher.config.run_config import load_run_config
from launcher.train.metrics import read_metrics
from tests.support.helpers import NO_DROPOUT, TEST_RANK_ENTRY, events, run_to_end, start_run, tiny_run_config

RAMP_STAGES = [{"name": "ramp", "max_seq_len": 32, "steps": 8,
                "global_batch_size": {"start": 4, "end": 16, "increment": 4, "over_steps": 6}},
               {"name": "wide", "max_seq_len": 16, "global_batch_size": 16, "steps": 4}]
TOTAL = 12
BATCHES = [4, 4, 8, 8, 12, 12, 16, 16, 16, 16, 16, 16]
STOP_BEFORE = 4  # the stop is taken a step later: the checkpoint at step 5, inside the batch-12 piece (steps 4-5)
TIMEOUT = 240


def train_records(run_dir) -> dict[int, dict]:
    return {r["step"]: r for r in read_metrics(run_dir, "train")}


def test_a_run_stopped_mid_ramp_resumes_at_another_world_size_with_the_same_losses_and_lrs(tmp_path, tiny_data):
    config = tiny_run_config(tmp_path, tiny_data, stages=RAMP_STAGES, model=NO_DROPOUT,
                             optimizer={"warmup_steps": 3, "batch_scaling": "linear", "reference_batch": 16},
                             logging={"valid_every": 0})
    cfg = load_run_config(config)
    straight = tmp_path / "straight"
    run_to_end(2, config, straight, module=TEST_RANK_ENTRY)
    expected = train_records(straight)
    assert sorted(expected) == list(range(1, TOTAL + 1))
    assert [expected[s]["global_batch_size"] for s in range(1, TOTAL + 1)] == BATCHES
    for step in range(1, TOTAL + 1):  # the curve x batch / reference, at every step
        assert expected[step]["lr"] == pytest.approx(cfg.learning_rate(step - 1), rel=1e-12)
        assert expected[step]["schedule_tokens"] == cfg.schedule.tokens_before(step)
    assert expected[1]["lr"] == pytest.approx(cfg.optimizer.lr / 3 * 4 / 16)
    # One stage_start per stage; the ramp's batches as batch_ramp events; validation only at the stage ends.
    assert [e["step"] for e in events(straight, "stage_start")] == [0, 8]
    assert [(e["step"], e["global_batch_size"]) for e in events(straight, "batch_ramp")] == [(2, 8), (4, 12), (6, 16)]
    assert [r["step"] for r in read_metrics(straight, "valid")] == [8, 12]

    stopped = tmp_path / "stopped"
    proc = start_run(2, config, stopped, module=TEST_RANK_ENTRY, ROFORMER_TEST_SIGTERM_LAUNCHER_AT=str(STOP_BEFORE))
    assert proc.wait(timeout=TIMEOUT) != 0
    resumed = tmp_path / "resumed"
    shutil.copytree(stopped, resumed)
    proc = start_run(1, config, resumed, module=TEST_RANK_ENTRY)
    assert proc.wait(timeout=TIMEOUT) == 0, (tmp_path / "resumed.log").read_text()[-4000:]
    event = events(resumed, "resume")[-1]
    assert (event["from_world_size"], event["world_size"]) == (2, 1)
    assert 4 <= event["step"] < 6  # inside the ramp's batch-12 piece
    got = train_records(resumed)
    assert sorted(got) == list(range(1, TOTAL + 1))
    for step in range(1, TOTAL + 1):
        assert got[step]["global_batch_size"] == BATCHES[step - 1]
        assert got[step]["lr"] == expected[step]["lr"], step
        assert abs(got[step]["loss"] - expected[step]["loss"]) <= 1e-6, (step, got[step]["loss"], expected[step]["loss"])
    assert [r["step"] for r in read_metrics(resumed, "valid")] == [8, 12]

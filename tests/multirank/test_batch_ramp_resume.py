"""A batch ramp inside a stage with the LR scaled to the batch, in real runs (issue 51): the ramp's batches are
trained on one engine (grad-accum and micro-batch change, no stage switch: the stage-end validation runs only at
the real stage's end), and a 2-rank run stopped in the middle of the ramp (a copy of the uninterrupted run trimmed to
its checkpoint there; a stop by signal itself: test_resume.py) and resumed at world size 1 (ZeRO-2), and at world
size 2 under ZeRO-1, gives the uninterrupted run's losses, batches and learning rates.

The ramp: 4 -> 16 sequences in steps of 4 over the stage's first 6 steps (4, 4, 8, 8, 12, 12, then 16), at
length 32 under a 128-token micro-batch budget, so the split changes at every piece (2 ranks: micro 2, 4, 3, 4;
1 rank: 4 x 1, 2, 3, 4), then a second stage at another length. LR = the curve x (batch / 16) (linear).
"""
from __future__ import annotations

import shutil

import pytest

from launcher.config.run_config import load_run_config
from launcher.train.metrics import read_metrics
from tests.support.helpers import NO_DROPOUT, TEST_RANK_ENTRY, events, run_to_end, start_run, tiny_run_config, \
    trimmed_copy

RAMP_STAGES = [{"name": "ramp", "max_seq_len": 32, "steps": 8,
                "global_batch_size": {"start": 4, "end": 16, "increment": 4, "over_steps": 6}},
               {"name": "wide", "max_seq_len": 16, "global_batch_size": 16, "steps": 4}]
TOTAL = 12
BATCHES = [4, 4, 8, 8, 12, 12, 16, 16, 16, 16, 16, 16]
CHECKPOINT = {"every_steps": 5, "keep_last": 4}  # 4: global_step5 is kept to the end (5, 8, 10, 12)
STOPPED_AT = 5  # global_step5 is inside the batch-12 piece (steps 5-6): the resume trains step 6 at batch 12
TIMEOUT = 240


def train_records(run_dir) -> dict[int, dict]:
    return {r["step"]: r for r in read_metrics(run_dir, "train")}


def test_a_run_stopped_mid_ramp_resumes_at_another_world_size_and_zero_stage_with_the_same_losses_and_lrs(tmp_path, tiny_data):
    config = tiny_run_config(tmp_path, tiny_data, stages=RAMP_STAGES, model=NO_DROPOUT,
                             optimizer={"warmup_steps": 3, "batch_scaling": "linear", "reference_batch": 16},
                             logging={"valid_every": 0}, checkpoint=CHECKPOINT)
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

    stopped = trimmed_copy(straight, tmp_path / "stopped", STOPPED_AT)
    zero1 = tiny_run_config(tmp_path, tiny_data, name="zero1.yaml", stages=RAMP_STAGES, model=NO_DROPOUT,
                            optimizer={"warmup_steps": 3, "batch_scaling": "linear", "reference_batch": 16},
                            logging={"valid_every": 0}, checkpoint=CHECKPOINT,
                            deepspeed={"overrides": {"zero_optimization": {"stage": 1}}})
    for name, ranks, run_config in (("resumed", 1, config), ("zero1", 2, zero1)):
        resumed = tmp_path / name
        shutil.copytree(stopped, resumed)
        proc = start_run(ranks, run_config, resumed, module=TEST_RANK_ENTRY)
        assert proc.wait(timeout=TIMEOUT) == 0, (tmp_path / f"{name}.log").read_text()[-4000:]
        event = events(resumed, "resume")[-1]
        assert (event["from_world_size"], event["world_size"]) == (2, ranks)
        assert (event["step"], event["tag"]) == (5, "global_step5")  # inside the ramp's batch-12 piece
        got = train_records(resumed)
        assert sorted(got) == list(range(1, TOTAL + 1))
        for step in range(1, TOTAL + 1):
            assert got[step]["global_batch_size"] == BATCHES[step - 1]
            assert got[step]["lr"] == expected[step]["lr"], (name, step)
            assert abs(got[step]["loss"] - expected[step]["loss"]) <= 1e-6, \
                (name, step, got[step]["loss"], expected[step]["loss"])
        assert [r["step"] for r in read_metrics(resumed, "valid")] == [8, 12]

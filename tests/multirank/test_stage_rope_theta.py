"""A per-stage RoPE base in a real 2-rank run: applied at the switch, exact across a resume, exported or refused.

The tiny three-stage run (tests.support.helpers.TINY_STAGES) with the middle stage at rope_theta
100 and the last back at the model's 10000 (a base far from 10000: the tiny model's attention is
nearly uniform, so even this moves its loss by under 1e-6; the two runs are bit-identical before). Checked against the uninterrupted session run
(`trainer_run`, the same schedule at 10000 throughout): equal losses up to the switch, different
after it; a copy stopped (SIGTERM) inside the 40000 stage and resumed equals the uninterrupted run
with the theta stage; the checkpoint at 40000 is refused by `export`, the last one (10000) exports
and transformers reproduces it (the exporter's parity check).
"""
from __future__ import annotations

import pytest

from launcher.downstream.exporter import export_checkpoint
from launcher.errors import UserError
from launcher.checkpoint.catalogue import read_sidecar
from launcher.train.metrics import read_metrics
from tests.support.helpers import (
    newest_checkpoint,
    NO_DROPOUT,
    TEST_RANK_ENTRY,
    TINY_STAGES,
    TINY_TOTAL_STEPS,
    events,
    run_to_end,
    start_run,
    tiny_run_config,
    train_losses,
)

THETA = 100.0
STAGES = [TINY_STAGES[0], {**TINY_STAGES[1], "rope_theta": THETA}, TINY_STAGES[2]]
SWITCH = TINY_STAGES[0]["steps"]  # steps completed when the theta stage starts
TIMEOUT = 300


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_data):
    """(uninterrupted run dir, stopped-and-resumed run dir, (return code of the stopped attempt, its resume point))."""
    root = tmp_path_factory.mktemp("stage_theta")
    config = tiny_run_config(root, tiny_data, model=NO_DROPOUT, stages=STAGES)
    straight = root / "straight"
    run_to_end(2, config, straight, module=TEST_RANK_ENTRY)
    resumed = root / "resumed"
    stopped = start_run(2, config, resumed, module=TEST_RANK_ENTRY, ROFORMER_TEST_SIGTERM_LAUNCHER_AT=str(SWITCH + 1))
    code = stopped.wait(timeout=TIMEOUT)
    point = newest_checkpoint(resumed)  # read now: keep_last prunes it once the run goes on
    run_to_end(2, config, resumed, module=TEST_RANK_ENTRY)
    return straight, resumed, (code, point)


def test_the_switch_changes_the_function_exactly_at_the_stage_boundary(runs, trainer_run):
    straight, _, _ = runs
    ours, plain = train_losses(straight), train_losses(trainer_run)
    # Same weights, data and base so far: two fresh CPU runs are bit-identical (measured: 0.0 at every step).
    before = [abs(ours[step] - plain[step]) for step in range(1, SWITCH + 1)]
    assert max(before) <= 1e-9, before
    # From the first step of the theta stage on, every loss leaves the reference's. The tiny model's
    # attention is nearly uniform, so the change is small (measured 2e-7 .. 9e-7) but far from 0.
    after = [abs(ours[step] - plain[step]) for step in range(SWITCH + 1, SWITCH + TINY_STAGES[1]["steps"] + 1)]
    assert min(after) > 1e-8, after
    starts = {e["stage"]: e for e in events(straight, "stage_start")}
    assert [starts[i]["rope_theta"] for i in range(3)] == [10000.0, THETA, 10000.0]


def test_resume_inside_the_theta_stage_equals_the_uninterrupted_run(runs):
    straight, resumed, (code, point) = runs
    assert code != 0  # stopped by the SIGTERM
    resumes = [r for r in read_metrics(resumed, "event") if r["event"] == "resume"]
    assert [r["tag"] for r in resumes] == [point.tag]
    assert point.sidecar.stage_name == "long" and point.sidecar.rope_theta == THETA and point.sidecar.step > SWITCH
    expected, got = train_losses(straight), train_losses(resumed)
    assert sorted(got) == list(range(1, TINY_TOTAL_STEPS + 1))
    for step in range(1, TINY_TOTAL_STEPS + 1):
        assert abs(got[step] - expected[step]) <= 1e-6, (step, got[step], expected[step])


def test_sidecars_record_the_base_of_their_stage(runs):
    straight = runs[0]
    end_of_theta_stage = SWITCH + TINY_STAGES[1]["steps"]
    assert read_sidecar(straight / "checkpoints" / f"global_step{end_of_theta_stage}").rope_theta == THETA
    assert read_sidecar(straight / "checkpoints" / f"global_step{TINY_TOTAL_STEPS}").rope_theta == 10000.0


def test_export_refuses_a_theta_checkpoint_and_round_trips_the_last_one(runs, tmp_path):
    straight = runs[0]
    tag = f"global_step{SWITCH + TINY_STAGES[1]['steps']}"
    with pytest.raises(UserError, match=r"rope_theta 100 \(stage 'long'\): transformers' RoFormer fixes RoPE's "
                                        r"base at 10000, so this checkpoint cannot be exported"):
        export_checkpoint(straight, tmp_path / "refused", tag=tag)
    assert not (tmp_path / "refused").exists()
    out = export_checkpoint(straight, tmp_path / "export")  # verify=True: transformers reproduces our logits
    from transformers import RoFormerForMaskedLM

    assert RoFormerForMaskedLM.from_pretrained(out).config.model_type == "roformer"


def test_checkpoint_evaluation_uses_the_recorded_base(runs, tiny_data):
    """The extension part's evaluator builds the model at the base the sidecar records."""
    from launcher.reproduce.checkpoint_mlm import evaluate_checkpoint

    straight = runs[0]
    tag = f"global_step{SWITCH + TINY_STAGES[1]['steps']}"
    report = evaluate_checkpoint(straight, tiny_data, [64], tokens=512, tag=tag)
    assert report["rope_theta"] == THETA and report["results"][0]["longer_than_trained"] is False
    assert report["results"][0]["masked_tokens"] > 0

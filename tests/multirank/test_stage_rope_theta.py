"""A per-stage RoPE base in a real 2-rank run: applied at the switch, recorded, exported or refused.

The tiny three-stage run (tests.support.helpers.TINY_STAGES) with the middle stage at rope_theta
100 and the last back at the model's 10000 (a base far from 10000: the tiny model's attention is
nearly uniform, so even this moves its loss by under 1e-6; the two runs are bit-identical before).
Checked against the uninterrupted session run (`trainer_run`, the same schedule at 10000 throughout):
equal losses up to the switch, different after it; the checkpoint at 100 is refused by `export`, the
last one (10000) exports and transformers reproduces it (the exporter's parity check). A stop and
resume inside a stage at another base: test_recipe_resume.py (its stage 2).
"""
from __future__ import annotations

import pytest

from launcher.export.exporter import export_checkpoint
from launcher.common.errors import UserError
from launcher.checkpoint.catalogue import read_sidecar
from tests.support.helpers import NO_DROPOUT, TEST_RANK_ENTRY, TINY_STAGES, TINY_TOTAL_STEPS, events, run_to_end, \
    tiny_run_config, train_losses

THETA = 100.0
STAGES = [TINY_STAGES[0], {**TINY_STAGES[1], "rope_theta": THETA}, TINY_STAGES[2]]
SWITCH = TINY_STAGES[0]["steps"]  # steps completed when the theta stage starts


@pytest.fixture(scope="module")
def straight(tmp_path_factory, tiny_data):
    """The uninterrupted run with the theta stage."""
    root = tmp_path_factory.mktemp("stage_theta")
    config = tiny_run_config(root, tiny_data, model=NO_DROPOUT, stages=STAGES)
    run_to_end(2, config, root / "straight", module=TEST_RANK_ENTRY)
    return root / "straight"


def test_the_switch_changes_the_function_exactly_at_the_stage_boundary(straight, trainer_run):
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


def test_sidecars_record_the_base_of_their_stage(straight):
    end_of_theta_stage = SWITCH + TINY_STAGES[1]["steps"]
    assert read_sidecar(straight / "checkpoints" / f"global_step{end_of_theta_stage}").rope_theta == THETA
    assert read_sidecar(straight / "checkpoints" / f"global_step{TINY_TOTAL_STEPS}").rope_theta == 10000.0


def test_export_refuses_a_theta_checkpoint_and_round_trips_the_last_one(straight, tmp_path):
    tag = f"global_step{SWITCH + TINY_STAGES[1]['steps']}"
    with pytest.raises(UserError, match=r"rope_theta 100 \(stage 'long'\): transformers' RoFormer fixes RoPE's "
                                        r"base at 10000, so this checkpoint cannot be exported"):
        export_checkpoint(straight, tmp_path / "refused", tag=tag)
    assert not (tmp_path / "refused").exists()
    out = export_checkpoint(straight, tmp_path / "export")  # verify=True: transformers reproduces our logits
    from transformers import RoFormerForMaskedLM

    assert RoFormerForMaskedLM.from_pretrained(out).config.model_type == "roformer"


def test_checkpoint_evaluation_uses_the_recorded_base(straight, tiny_data):
    """The extension part's evaluator builds the model at the base the sidecar records."""
    from launcher.reproduce.checkpoint_mlm import evaluate_checkpoint

    tag = f"global_step{SWITCH + TINY_STAGES[1]['steps']}"
    report = evaluate_checkpoint(straight, tiny_data, [64], tokens=512, tag=tag)
    assert report["rope_theta"] == THETA and report["results"][0]["longer_than_trained"] is False
    assert report["results"][0]["masked_tokens"] > 0

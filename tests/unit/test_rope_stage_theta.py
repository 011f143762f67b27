"""RoPE's base (theta) as a per-stage field of the schedule: parsing, resolution, the in-place switch
on a live model, and what the sidecar records (old sidecars still read).

The multi-rank half (a real run switching theta at a stage boundary, resumed across it, exported)
is tests/multirank/test_stage_rope_theta.py.
"""
from __future__ import annotations

import pytest
import torch

from launcher.config.run_config import load_run_config
from launcher.config.schedule import load_schedule
from launcher.config.stages import format_plan, resolve_stages
from launcher.common.errors import UserError
from launcher.checkpoint.catalogue import CheckpointSidecar, effective_rope_theta
from roformer import RoFormerConfig, RoFormerForMaskedLM
from roformer.rope import RotaryEmbedding, set_rope_theta
from tests.support.helpers import run_config_dict, write_schedule, write_yaml

STAGES = [{"name": "short", "max_seq_len": 32, "global_batch_size": 8, "steps": 3},
          {"name": "extend", "max_seq_len": 64, "global_batch_size": 4, "steps": 2, "rope_theta": 80000}]


def _cfg(tmp_path, stages, **model):
    schedule = write_schedule(tmp_path / "sched.yaml", stages)
    raw = run_config_dict(schedule_file=schedule)
    raw["model"].update(model)
    return load_run_config(write_yaml(tmp_path / "run.yaml", raw))


def test_a_stage_theta_is_parsed_and_other_stages_use_the_models(tmp_path):
    stages = resolve_stages(_cfg(tmp_path, STAGES, rope_theta=20000.0), 1)
    assert [s.rope_theta for s in stages] == [20000.0, 80000.0]
    assert "rope_theta per stage: short 20000, extend 80000" in format_plan(stages, 1)


def test_a_schedule_without_theta_plans_as_before(tmp_path):
    stages = resolve_stages(_cfg(tmp_path, [STAGES[0]]), 1)
    assert stages[0].rope_theta == 10000.0 and "rope_theta" not in format_plan(stages, 1)


@pytest.mark.parametrize("bad", [0, -5, 1, True, "big", float("inf")])
def test_a_bad_theta_names_file_stage_and_field(tmp_path, bad):
    path = write_schedule(tmp_path / "sched.yaml", [STAGES[0], {**STAGES[1], "rope_theta": bad}])
    with pytest.raises(UserError, match=r"sched\.yaml: stage 2 \(extend\): rope_theta must be a number > 1"):
        load_schedule(path)


def test_theta_on_an_absolute_position_model_is_refused_before_training(tmp_path):
    cfg = _cfg(tmp_path, STAGES, position_encoding="learned", max_position_embeddings=64)
    with pytest.raises(UserError, match=r"stage 2 \(extend\): rope_theta needs a RoPE model"):
        resolve_stages(cfg, 1)
    assert resolve_stages(_cfg(tmp_path, [STAGES[0]], position_encoding="learned",
                               max_position_embeddings=64), 1)[0].rope_theta is None


@pytest.mark.parametrize("scaling", [("none", 1.0), ("ntk", 4.0), ("linear", 2.0)])
def test_switching_theta_on_a_live_model_equals_a_fresh_model_built_with_it(scaling):
    """The stage switch: same weights, new base; the table cached at the old base is not reused."""
    torch.manual_seed(0)
    small = dict(vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, rope_scaling=scaling[0],
                 rope_scaling_factor=scaling[1], initializer_range=0.5)  # sharp attention: position matters
    live = RoFormerForMaskedLM(RoFormerConfig(**small)).eval()
    ids = torch.randint(5, 300, (2, 300))  # longer than one growth quantum: the cache holds 512 rows
    before = live(ids).logits
    assert set_rope_theta(live, 80000.0) == 1
    fresh = RoFormerForMaskedLM(RoFormerConfig(**small, rope_theta=80000.0)).eval()
    fresh.load_state_dict(live.state_dict())
    after, expected = live(ids).logits, fresh(ids).logits
    assert torch.equal(after, expected)  # bit for bit: the same float64 -> float32 table
    assert not torch.allclose(before, after, atol=1e-4)  # and the base really changed the function
    set_rope_theta(live, 10000.0)
    assert torch.equal(live(ids).logits, before)  # back at the first base: the first function


def test_set_base_rebuilds_the_tables_exactly():
    rope = RotaryEmbedding(16)
    rope.cos_sin(300, torch.device("cpu"))
    rope.set_base(500000.0)
    fresh = RotaryEmbedding(16, base=500000.0)
    for got, want in zip(rope.cos_sin(300, torch.device("cpu")), fresh.cos_sin(300, torch.device("cpu"))):
        assert torch.equal(got, want)


def _sidecar_dict(**extra) -> dict:
    return {"tag": "global_step4", "step": 4, "stage_index": 1, "stage_name": "extend", "step_in_stage": 1,
            "stage_complete": False, "consumed_samples": 8, "consumed_tokens": 100, "last_validation": {},
            "data_state": {}, "model_config": RoFormerConfig(rope_theta=20000.0).to_dict(), "world_size": 2,
            "loss_scale": 1.0, "skipped_steps": 0, "zero_stage": 2, "precision": "fp32", "total_steps": 5,
            "complete": True, "format": 2, **extra}


def test_sidecar_records_the_stage_theta_and_old_sidecars_still_read():
    new = CheckpointSidecar.from_dict(_sidecar_dict(rope_theta=80000.0), "x")
    assert new.to_dict()["rope_theta"] == 80000.0 and effective_rope_theta(new) == 80000.0
    old = CheckpointSidecar.from_dict(_sidecar_dict(), "x")  # written before the field existed
    assert old.rope_theta is None and "rope_theta" not in old.to_dict()  # round-trips unchanged
    assert effective_rope_theta(old) == 20000.0  # the model config's base was the one in force
    absolute = _sidecar_dict(model_config=RoFormerConfig(position_encoding="learned",
                                                         max_position_embeddings=64).to_dict())
    assert effective_rope_theta(CheckpointSidecar.from_dict(absolute, "x")) is None
    with pytest.raises(UserError, match="field 'rope_theta'"):
        CheckpointSidecar.from_dict(_sidecar_dict(rope_theta="big"), "x")

"""Batch arithmetic per stage for a world size, and the resolved DeepSpeed config."""
from __future__ import annotations

import pytest

from launcher.config.deepspeed_json import DeepSpeedJson
from launcher.resolved.stage_configs import resolve_ds_config
from launcher.config.run_config import load_run_config
from launcher.config.stages import resolve_stages
from launcher.common.errors import UserError
from tests.support.helpers import REPO, run_config_dict, write_schedule, write_yaml


def _config(tmp_path, stages, overrides=(), **sections):
    schedule = write_schedule(tmp_path / "sched.yaml", stages)
    return load_run_config(write_yaml(tmp_path / "run.yaml", run_config_dict(schedule_file=schedule, **sections)),
                           list(overrides))


def test_reference_config_on_the_reference_cluster():
    cfg = load_run_config(REPO / "configs/reference_v100.yaml")
    stages = resolve_stages(cfg, 8)
    for s in stages:
        assert s.micro_batch_size * s.grad_accum_steps * 8 == s.global_batch_size
        assert s.micro_batch_size * s.max_seq_len <= cfg.schedule.max_tokens_per_micro_batch
    assert [s.first_step for s in stages] == [0, 200_000, 212_500, 332_500, 412_500, 422_500]
    assert cfg.schedule.total_steps == stages[-1].end_step == 452_500


def test_explicit_and_budgeted_micro_batches(tmp_path):
    cfg = _config(tmp_path, [{"max_seq_len": 16, "global_batch_size": 12, "steps": 2},
                             {"max_seq_len": 64, "global_batch_size": 8, "steps": 3, "micro_batch_size": 1}],
                  schedule={"max_tokens_per_micro_batch": 64})
    one, two = resolve_stages(cfg, 2)
    assert (one.micro_batch_size, one.grad_accum_steps) == (3, 2)  # largest divisor of 6 with 16*m <= 64
    assert (two.micro_batch_size, two.grad_accum_steps, two.first_step) == (1, 4, 2)
    assert cfg.schedule.stage_for_step(1) == (0, 1) and cfg.schedule.stage_for_step(2) == (1, 0)
    single = resolve_stages(cfg, 1)
    assert (single[0].micro_batch_size, single[0].grad_accum_steps) == (4, 3)


@pytest.mark.parametrize("stages, world, message", [
    ([{"name": "big", "max_seq_len": 8, "global_batch_size": 6, "steps": 1}], 4,
     "stage 1 (big): global_batch_size 6 is not divisible by the world size 4"),
    ([{"max_seq_len": 8, "global_batch_size": 8, "steps": 1},
      {"name": "odd", "max_seq_len": 8, "global_batch_size": 8, "steps": 1, "micro_batch_size": 3}], 2,
     "stage 2 (odd): global_batch_size 8 is not divisible by micro_batch_size 3 x world size 2"),
    ([{"name": "huge", "max_seq_len": 4096, "global_batch_size": 8, "steps": 1}], 1,
     "stage 1 (huge): one sequence of max_seq_len 4096 does not fit"),
])
def test_stage_errors_name_the_stage(tmp_path, stages, world, message):
    cfg = _config(tmp_path, stages)
    with pytest.raises(UserError) as info:
        resolve_stages(cfg, world)
    assert message in str(info.value)


def test_learned_positions_shorter_than_a_stage(tmp_path):
    cfg = _config(tmp_path, [{"max_seq_len": 64, "global_batch_size": 4, "steps": 1},
                             {"name": "long", "max_seq_len": 256, "global_batch_size": 4, "steps": 1}],
                  ["model.position_encoding=learned", "model.max_position_embeddings=128"])
    with pytest.raises(UserError, match=r"stage 2 \(long\): max_seq_len 256 is longer than the model's learned"):
        resolve_stages(cfg, 1)


def test_world_size_must_be_positive(tmp_path):
    cfg = _config(tmp_path, [{"max_seq_len": 8, "global_batch_size": 4, "steps": 1}])
    with pytest.raises(UserError, match="world size"):
        resolve_stages(cfg, 0)


def test_resolved_ds_config_carries_the_stage_arithmetic(tmp_path):
    cfg = _config(tmp_path, [{"max_seq_len": 16, "global_batch_size": 12, "steps": 2}],
                  deepspeed={"config": str(REPO / "ds_configs/v100_fp16_zero2.json"),
                             "overrides": {"fp16": {"initial_scale_power": 8}}})
    stage = resolve_stages(cfg, 3)[0]
    ds = resolve_ds_config(cfg, stage, 3, DeepSpeedJson.of(cfg), load_universal=True)
    assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == \
        (12, 4, 1)
    assert ds["fp16"]["initial_scale_power"] == 8 and ds["fp16"]["enabled"] is True
    assert ds["optimizer"]["params"]["lr"] == cfg.optimizer.lr and ds["checkpoint"]["load_universal"] is True


@pytest.mark.parametrize("content, message", [
    ('{"train_batch_size": 8}', "train_batch_size: batch sizes come from the schedule"),
    ('{"zero_optimisation": {"stage": 2}}', "unknown DeepSpeed key(s): zero_optimisation"),
    ('{"scheduler": {"type": "WarmupLR"}}', "scheduler: the learning rate comes from the run config"),
    ('{"fp16": {"enabled": true},\n "bf16": }', "line 2: not valid JSON"),
    ('{"gradient_allreduce_op": "sum"}', "gradient_allreduce_op: only 'mean' is supported"),
    ('{"bf16": {"enabled": true}, "zero_optimization": {"stage": 0}}',
     "zero_optimization.stage: 0 with bf16 cannot be exported in fp32"),
    ('{"fp16": {"enabled": true}}', "zero_optimization.stage: 0 with fp16 cannot be exported in fp32"),
])
def test_bad_deepspeed_json(tmp_path, content, message):
    (tmp_path / "ds.json").write_text(content)
    cfg = _config(tmp_path, [{"max_seq_len": 8, "global_batch_size": 4, "steps": 1}],
                  deepspeed={"config": str(tmp_path / "ds.json")})
    with pytest.raises(UserError) as info:
        resolve_ds_config(cfg, resolve_stages(cfg, 1)[0], 1, DeepSpeedJson.of(cfg))
    assert message in str(info.value)

"""Stage lookup and learning rate: pure functions of the global step."""
from __future__ import annotations

import math

import pytest

from launcher.config.schedule import learning_rate, load_schedule, stage_index_at
from launcher.common.errors import UserError
from tests.support.helpers import REPO, write_schedule

TABLE4 = [(512, 256, 200_000), (1536, 256, 12_500), (256, 256, 120_000), (128, 512, 80_000),
          (1536, 256, 10_000), (512, 512, 30_000)]


def test_table4_schedule_is_the_paper_verbatim():
    stages = load_schedule(REPO / "launcher/schedules/table4_v100.yaml")
    assert [(s.max_seq_len, s.global_batch_size, s.steps) for s in stages] == TABLE4


def test_tiny_schedule_changes_length_and_batch_at_every_boundary():
    stages = load_schedule(REPO / "launcher/schedules/tiny_cpu.yaml")
    assert len(stages) >= 3
    for before, after in zip(stages, stages[1:]):
        assert before.max_seq_len != after.max_seq_len and before.global_batch_size != after.global_batch_size


def test_step_to_stage_boundaries():
    steps = [3, 2, 4]
    expected = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1), (2, 2), (2, 3)]
    assert [stage_index_at(steps, s) for s in range(9)] == expected
    assert stage_index_at(steps, 9) == (2, 4)  # past the end: the last stage, step_in_stage == its steps
    with pytest.raises(ValueError):
        stage_index_at(steps, -1)


def test_learning_rate_warmup_decay_and_stage_scale():
    lr = lambda step, scale=1.0: learning_rate(step, 110, 1.0, 10, "linear", 0.1, scale)  # noqa: E731
    assert lr(0) == pytest.approx(0.1) and lr(9) == pytest.approx(1.0)
    assert lr(10) == pytest.approx(1.0) and lr(60) == pytest.approx(0.55) and lr(110) == pytest.approx(0.1)
    assert lr(60, scale=0.5) == pytest.approx(0.275)
    values = [lr(s) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(values, values[1:]))
    cos = learning_rate(60, 110, 1.0, 10, "cosine", 0.0)
    assert cos == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))
    assert learning_rate(100, 110, 1.0, 10, "constant", 0.0) == 1.0


@pytest.mark.parametrize("stages, message", [
    ([], "the schedule is empty"),
    ([{"max_seq_len": 8, "global_batch_size": 4, "steps": 0}], "steps must be a positive integer, got 0"),
    ([{"max_seq_len": 8, "global_batch_size": 4, "steps": -5}], "steps must be a positive integer, got -5"),
    ([{"max_seq_len": 8, "global_batch_size": 4}], "steps is required"),
    ([{"max_seq_len": 8, "global_batch_size": 4, "steps": 1, "lenght": 3}], "unknown key(s) lenght"),
    ([{"name": "warm", "max_seq_len": 8, "global_batch_size": 4, "steps": 1, "lr_scale": 0}], "(warm): lr_scale"),
])
def test_bad_schedules_name_the_stage(tmp_path, stages, message):
    path = write_schedule(tmp_path / "s.yaml", stages)
    with pytest.raises(UserError) as info:
        load_schedule(path)
    assert message in str(info.value) and "s.yaml" in str(info.value)

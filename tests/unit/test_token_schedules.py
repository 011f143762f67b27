"""Stages counted in tokens, batch ramps inside a stage, the LR scaled to the batch (launcher/config/schedule.py,
launcher/config/stages.py, launcher/config/run_config.py; issue 51). The multi-rank stop and resume inside a ramp:
tests/multirank/test_batch_ramp_resume.py."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from launcher.cli import main as cli_main
from launcher.config.run_config import load_run_config
from launcher.config.schedule import BatchRamp, load_schedule, parse_token_count, stage_pieces
from launcher.config.stages import format_plan, resolve_stages
from launcher.run_dir.records import stage_ends
from launcher.config.stages import stage_ends as resolved_stage_ends
from launcher.common.errors import UserError
from tests.support.helpers import REPO, run_config_dict, write_schedule, write_yaml

RECIPES = REPO / "configs" / "recipes"
STAGE = {"max_seq_len": 16, "global_batch_size": 4, "steps": 10}


def config(tmp_path: Path, stages: list[dict], optimizer: dict | None = None, **sections) -> Path:
    """A run config over `stages`; a token twin given (warmup_tokens, every_tokens) replaces its steps field."""
    schedule = write_schedule(tmp_path / "schedule.yaml", stages)
    raw = run_config_dict(schedule_file=schedule, optimizer=optimizer or {"warmup_steps": 2}, **sections)
    for section, twin, steps in (("optimizer", "warmup_tokens", "warmup_steps"), ("checkpoint", "every_tokens",
                                                                                   "every_steps")):
        given = {**(optimizer or {}), **sections.get(section, {})}
        if twin in raw.get(section, {}) and steps not in given:
            raw[section].pop(steps, None)
    return write_yaml(tmp_path / "run.yaml", raw)


def batches_by_step(cfg, world_size: int = 2) -> list[tuple[int, int, int, int]]:
    """(stage index, global batch, max_seq_len, grad-accum) of every step, from the resolved entries."""
    return [(s.index, s.global_batch_size, s.max_seq_len, s.grad_accum_steps)
            for s in resolve_stages(cfg, world_size) for _ in range(s.steps)]


# --- token counts -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value, tokens", [(2.5e9, 2_500_000_000), ("2.5B", 2_500_000_000), ("800M", 800_000_000),
                                           ("1.7T", 1_700_000_000_000), ("12k", 12_000), (4096, 4096),
                                           ("3e6", 3_000_000), ("26.2144B", 26_214_400_000)])
def test_token_counts_parse_with_decimal_suffixes(value, tokens):
    assert parse_token_count(value, "f: tokens") == tokens


def test_table4_in_tokens_is_the_steps_version_batch_for_batch(tmp_path):
    steps = load_run_config(config(tmp_path / "a", []), [f"schedule.file={REPO / 'launcher/schedules/table4_v100.yaml'}",
                                                         "schedule.max_tokens_per_micro_batch=8192"])
    tokens = load_run_config(config(tmp_path / "b", []), [f"schedule.file={RECIPES / 'table4_tokens_schedule.yaml'}",
                                                          "schedule.max_tokens_per_micro_batch=8192"])
    assert [s.steps for s in tokens.schedule.stages] == [200000, 12500, 120000, 80000, 10000, 30000]
    assert [s.to_dict() for s in resolve_stages(tokens, 8)] == [s.to_dict() for s in resolve_stages(steps, 8)]
    assert all(tokens.learning_rate(i) == steps.learning_rate(i) for i in (0, 99, 100, 200000, 452499))
    # The stage whose length is cut with the batch unchanged is warned about (tokens per step fall 6x).
    assert any("stage 'stage3': tokens per step fall from 393,216 to 65,536" in w for w in tokens.schedule_warnings())


def test_a_token_stage_rounds_to_whole_steps_and_the_plan_says_so(tmp_path):
    per_step = 4 * 16  # batch x length
    stages = [{"name": "a", "max_seq_len": 16, "global_batch_size": 4, "tokens": 10 * per_step + per_step // 2},
              {"name": "b", "max_seq_len": 16, "global_batch_size": 4, "tokens": 10 * per_step + per_step // 2 - 1}]
    cfg = load_run_config(config(tmp_path, stages))
    assert [s.steps for s in cfg.schedule.stages] == [11, 10]  # half a step and more rounds up
    plan = format_plan(resolve_stages(cfg, 1), 1, cfg)
    assert "stage 'a' in tokens: asked 672 (672), 11 steps train 704 (+32, rounded to whole steps)" in plan
    assert "stage 'b' in tokens: asked 671 (671), 10 steps train 640 (-31, rounded to whole steps)" in plan


def test_token_twins_of_warmup_decay_and_checkpointing_resolve_to_steps(tmp_path):
    stages = [{"name": "a", "max_seq_len": 16, "global_batch_size": {"start": 2, "end": 4, "over_steps": 4},
               "steps": 10}, {"name": "b", **STAGE}]  # token slots per step: 32 x 4 steps, then 64 x 16
    cfg = load_run_config(config(tmp_path, stages, {"warmup_tokens": 100, "decay": "wsd", "decay_tokens": "0.5K"},
                                 checkpoint={"every_tokens": "192"}))
    # Warmup: 32 x 4 = 128 >= 100 after 4 steps. Every: 128 + 64 = 192 after 5. Decay: the run's 1,152 - 500 = 652
    # are reached after 13 steps (128 + 9 x 64 = 704; 640 after 12), so the window is the last 20 - 13 = 7.
    assert cfg.optimizer.warmup_steps == 4 and cfg.checkpoint.every_steps == 5 and cfg.decay_steps == 7
    recorded = cfg.to_dict()
    assert "warmup_tokens" not in recorded["optimizer"] and recorded["optimizer"]["warmup_steps"] == 4
    assert "every_tokens" not in recorded["checkpoint"] and recorded["checkpoint"]["every_steps"] == 5


# --- batch ramps ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ramp", [{"start": 4, "end": 16, "over_steps": 9}, {"start": 4, "end": 14, "over": "2K"},
                                  {"start": 4, "end": 16, "increment": 2, "over": 3000}])
def test_a_ramps_batch_at_each_step_is_the_formula(tmp_path, ramp):
    """batch(x) = start + inc x floor((end - start) x x / (over x inc)), capped at end, end from x >= over, where
    x is the tokens (or steps) trained in the stage before the step; pieces change only the engine's batch."""
    length, steps = 16, 30
    cfg = load_run_config(config(tmp_path, [{"name": "r", "max_seq_len": length, "global_batch_size": ramp,
                                              "steps": steps}, {"name": "b", **STAGE}]))
    start, end, inc = ramp["start"], ramp["end"], ramp.get("increment", ramp["start"])
    over = ramp.get("over_steps") or parse_token_count(ramp["over"], "")
    expected, done_tokens = [], 0
    for step in range(steps):
        x = step if "over_steps" in ramp else done_tokens
        batch = end if x >= over else min(end, start + inc * math.floor((end - start) * x / (over * inc)))
        expected.append(batch)
        done_tokens += batch * length
    got = batches_by_step(cfg)
    assert [b for _, b, _, _ in got[:steps]] == expected and expected[-1] == end
    assert all(cfg.schedule.global_batch_at(step) == b for step, b in enumerate(expected))
    resolved = resolve_stages(cfg, 2)
    ramp_entries = [s for s in resolved if s.index == 0]
    assert len(ramp_entries) > 1 and [s.piece for s in ramp_entries] == list(range(len(ramp_entries)))
    # The stage ends once, at its last piece's end: that is where stage-end hooks run.
    assert all(s.stage_end_step == steps for s in ramp_entries) and stage_ends([s.to_dict() for s in resolved]) == [steps, steps + 10]
    assert resolved_stage_ends(resolved) == [steps, steps + 10]  # the trackers' ends from the stages at hand
    assert [s.to_dict().get("pieces") for s in resolved] == [len(ramp_entries)] * len(ramp_entries) + [None]


def test_a_token_ramp_stage_integrates_its_batches_to_its_tokens():
    ramp = BatchRamp(start=256, end=4096, increment=256, over=50 * 10**9, unit="tokens")
    pieces = stage_pieces(1024, None, ramp, tokens=2 * 10**12)
    assert [b for b, _ in pieces] == list(range(256, 4097, 256))
    trained = sum(b * n for b, n in pieces) * 1024
    assert abs(trained - 2 * 10**12) <= 4096 * 1024 // 2  # within half of the last batch's step
    ramp_tokens = sum(b * n for b, n in pieces[:-1]) * 1024
    assert 50 * 10**9 <= ramp_tokens < 50 * 10**9 + 3840 * 1024  # the end batch from the first step past `over`


@pytest.mark.parametrize("scaling, power", [("linear", 1.0), ("sqrt", 0.5)])
def test_the_lr_is_the_curve_times_the_batch_ratio_to_the_power(tmp_path, scaling, power):
    stages = [{"name": "r", "max_seq_len": 16, "global_batch_size": {"start": 4, "end": 16, "over_steps": 6},
               "steps": 12}, {"name": "b", **STAGE, "global_batch_size": 8}]
    cfg = load_run_config(config(tmp_path, stages, {"warmup_steps": 3, "decay": "cosine", "batch_scaling": scaling,
                                                    "reference_batch": 8}))
    plain = load_run_config(config(tmp_path / "plain", stages, {"warmup_steps": 3, "decay": "cosine"}))
    for step in range(cfg.schedule.total_steps):
        batch = cfg.schedule.global_batch_at(step)
        assert cfg.learning_rate(step) == pytest.approx(plain.learning_rate(step) * (batch / 8) ** power, rel=1e-12)
    assert cfg.schedule.global_batch_at(0) == 4 and cfg.schedule.global_batch_at(11) == 16
    plan = format_plan(resolve_stages(cfg, 2), 2, cfg)
    assert f"(optimizer.batch_scaling {scaling})" in plan and "ramp: 4 x 2, 8 x 2, 12 x 2, 16 x 6" in plan


# --- bad values and warnings ---------------------------------------------------------------------------------


@pytest.mark.parametrize("stage, message", [
    ({"tokens": "2.5Q"}, "stage 2 (bad): tokens must be a positive token count"),
    ({"tokens": -5}, "stage 2 (bad): tokens must be a positive token count"),
    ({"tokens": 100, "steps": 3}, "stage 2 (bad): give steps or tokens (the stage's length), not both"),
    ({"tokens": 10}, "stage 2 (bad): tokens 10 is less than half a step (64 tokens per step"),
    ({"global_batch_size": {"start": 8, "end": 4, "over_steps": 2}}, "global_batch_size: end 4 must be larger than start 8"),
    ({"global_batch_size": {"start": 4, "end": 8, "over_steps": 20}},
     "global_batch_size: the ramp's over_steps 20 is longer than the stage (10 steps)"),
    ({"tokens": 640, "global_batch_size": {"start": 4, "end": 8, "over": "1K"}},
     "global_batch_size: the ramp's over 1K is longer than the stage (640 tokens)"),
    ({"global_batch_size": {"start": 4, "end": 8}}, "give exactly one of over (tokens) and over_steps (steps), got neither"),
    ({"global_batch_size": {"start": 4, "end": 8, "over": "2.5Q"}}, "global_batch_size: over must be a positive token"),
    ({"global_batch_size": {"start": 4, "end": 8, "over_steps": 2, "by": 1}}, "unknown key(s) by in the ramp"),
])
def test_bad_token_and_ramp_values_are_one_line_naming_file_and_stage(tmp_path, capsys, stage, message):
    entry = {"name": "bad", **STAGE, **stage}
    if "tokens" in stage and "steps" not in stage:
        entry.pop("steps")
    path = config(tmp_path, [STAGE, entry])
    with pytest.raises(UserError) as info:
        load_schedule(tmp_path / "schedule.yaml")
    assert "schedule.yaml: stage 2 (bad)" in str(info.value) and message in str(info.value)
    assert cli_main(["plan", "--config", str(path), "--world-size", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


@pytest.mark.parametrize("optimizer, message", [
    ({"batch_scaling": "linear"}, "optimizer.reference_batch: required when optimizer.batch_scaling is 'linear'"),
    ({"batch_scaling": "square", "reference_batch": 4}, "optimizer.batch_scaling: must be one of none, linear, sqrt"),
    ({"warmup_tokens": "9K"}, "optimizer.warmup_tokens: 9K tokens is longer than the run (1,280 token slots"),
    ({"warmup_tokens": "1K", "warmup_steps": 3}, "give optimizer.warmup_steps or optimizer.warmup_tokens, not both"),
    ({"decay_tokens": 100}, "optimizer.decay_tokens: only applies to optimizer.decay: wsd"),
    ({"warmup_tokens": "2.5Q"}, "optimizer.warmup_tokens must be a positive token count"),
])
def test_bad_optimizer_token_and_scaling_settings_are_one_line(tmp_path, capsys, optimizer, message):
    path = config(tmp_path, [STAGE, STAGE], optimizer)
    assert cli_main(["plan", "--config", str(path), "--world-size", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_a_piece_whose_batch_does_not_divide_is_refused_by_name(tmp_path):
    cfg = load_run_config(config(tmp_path, [{"name": "r", "max_seq_len": 16, "steps": 10, "micro_batch_size": 2,
                                             "global_batch_size": {"start": 4, "end": 10, "increment": 2,
                                                                   "over_steps": 6}}]))
    with pytest.raises(UserError, match=r"stage 1 \(r\), ramp batch 2/4: global_batch_size 6 is not divisible by "
                                        r"micro_batch_size 2 x world size 2"):
        resolve_stages(cfg, 2)


def test_warnings_for_an_unreached_ramp_and_a_reference_outside_the_batches(tmp_path):
    stages = [{"name": "r", "max_seq_len": 16, "steps": 4, "global_batch_size": {"start": 4, "end": 8, "over": 9000}},
              {"name": "b", **STAGE}]
    cfg = load_run_config(config(tmp_path, stages, {"warmup_steps": 1, "batch_scaling": "linear",
                                                    "reference_batch": 64}))
    warnings = cfg.schedule_warnings()
    assert any("stage 'r': the batch ramp (4 -> 8 over 9K tokens in steps of 4) ends the stage at batch 4" in w
               for w in warnings), warnings
    assert any("optimizer.reference_batch 64 is outside the schedule's batches (4 to 4)" in w for w in warnings)
    assert "warning: stage 'r': the batch ramp" in format_plan(resolve_stages(cfg, 1), 1, cfg)


def test_the_modernbert_style_recipe_ramps_and_scales(tmp_path):
    cfg = load_run_config(RECIPES / "demo_batch_warmup_tokens.yaml")
    first = cfg.schedule.stages[0]
    assert first.ramp is not None and [b for b, _ in first.pieces] == [8, 16, 24, 32]
    assert cfg.optimizer.batch_scaling == "sqrt" and cfg.schedule_warnings() == []
    assert cfg.learning_rate(0) == pytest.approx(cfg.optimizer.lr / cfg.optimizer.warmup_steps * math.sqrt(8 / 32))
    resolved = resolve_stages(cfg, 2)
    assert [s.global_batch_size for s in resolved if s.index == 0] == [8, 16, 24, 32]

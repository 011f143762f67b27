"""Recipe stage fields (mask_prob, mixture), warmup-stable-decay, and the shipped recipes
(launcher/config/schedule.py, launcher/config/run_config.py, configs/recipes/)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from data_pipeline import DataError, PretrainBatches, open_corpus
from data_pipeline.config import NUM_SPECIAL_IDS
from launcher.cli import main as cli_main
from launcher.config.run_config import load_run_config
from launcher.config.schedule import learning_rate, load_schedule, run_learning_rate
from launcher.config.stages import format_plan, resolve_stages
from launcher.common.errors import UserError
from launcher.checkpoint.catalogue import CheckpointSidecar
from tests.support.corpus_files import prepared_dir
from tests.support.helpers import REPO, run_config_dict, write_schedule, write_yaml

RECIPES = REPO / "configs" / "recipes"
STAGE = {"max_seq_len": 16, "global_batch_size": 4, "steps": 10}


def recipe_config(tmp_path, stages: list[dict], **optimizer) -> Path:
    schedule = write_schedule(tmp_path / "schedule.yaml", stages)
    return write_yaml(tmp_path / "run.yaml", run_config_dict(schedule_file=schedule,
                                                             optimizer={"warmup_steps": 2, **optimizer}))


# --- stage fields -----------------------------------------------------------------------------------------


def test_mask_prob_and_mixture_are_parsed_normalised_and_resolved(tmp_path):
    stages = [{"name": "a", **STAGE, "mask_prob": 0.3, "mixture": {"zh": 1, "en": 3}},
              {"name": "b", **STAGE},
              {"name": "c", **STAGE, "mask_prob": 0.05, "mixture": {"en": 0, "zh": 2.5}}]
    cfg = load_run_config(recipe_config(tmp_path, stages))
    parsed = cfg.schedule.stages
    assert parsed[0].mask_prob == 0.3 and parsed[0].mixture == (("zh", 0.25), ("en", 0.75))  # file order
    assert parsed[1].mask_prob is None and parsed[1].mixture is None
    assert parsed[2].mixture == (("en", 0.0), ("zh", 1.0))
    resolved = resolve_stages(cfg, 2)
    # The rate in force: the stage's, else data.masking's (0.15 by default).
    assert [s.mask_prob for s in resolved] == [0.3, cfg.data.masking.mask_prob, 0.05]
    assert resolved[0].to_dict()["mixture"] == {"zh": 0.25, "en": 0.75} and resolved[1].to_dict()["mixture"] is None
    plan = format_plan(resolved, 2)
    assert "mask_prob per stage: a 0.3, b 0.15, c 0.05" in plan
    assert "mixture per stage: a zh 0.25, en 0.75; b sources by size; c en 0, zh 1" in plan


def test_a_schedule_without_the_fields_plans_as_before(tmp_path):
    cfg = load_run_config(recipe_config(tmp_path, [STAGE, STAGE]), ["data.masking.mask_prob=0.2"])
    resolved = resolve_stages(cfg, 1)
    assert [s.mask_prob for s in resolved] == [0.2, 0.2] and all(s.mixture is None for s in resolved)
    assert "mask_prob" not in format_plan(resolved, 1) and "mixture" not in format_plan(resolved, 1)


@pytest.mark.parametrize("field, value, message", [
    ("mask_prob", 0, "mask_prob must be a number in (0, 1)"),
    ("mask_prob", 1, "mask_prob must be a number in (0, 1)"),
    ("mask_prob", 1.5, "mask_prob must be a number in (0, 1)"),
    ("mask_prob", "high", "mask_prob must be a number in (0, 1)"),
    ("mask_prob", True, "mask_prob must be a number in (0, 1)"),
    ("mixture", {"en": -1, "zh": 2}, "mixture.en: the weight must be a number >= 0, got -1"),
    ("mixture", {"en": 0, "zh": 0.0}, "mixture: all weights are 0"),
    ("mixture", {}, "mixture must be a mapping of source name to weight"),
    ("mixture", ["en", "zh"], "mixture must be a mapping of source name to weight"),
    ("mixture", {"en": "lots"}, "mixture.en: the weight must be a number >= 0"),
])
def test_bad_stage_fields_exit_2_in_one_line_naming_file_stage_and_field(tmp_path, capsys, field, value, message):
    path = recipe_config(tmp_path, [STAGE, {"name": "decay", **STAGE, field: value}])
    with pytest.raises(UserError) as info:
        load_schedule(tmp_path / "schedule.yaml")
    assert f"schedule.yaml: stage 2 (decay): {message}" in str(info.value)
    assert cli_main(["plan", "--config", str(path), "--world-size", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("roformer plan: error: ") and message in err[0]
    assert "schedule.yaml: stage 2 (decay)" in err[0]


def test_set_mask_prob_changes_later_batches_and_resumes_exactly(tmp_path_factory):
    """A sequence's masks are a function of (seed, its index, the rate): a reader resumed mid-stage that
    sets the stage's rate again hands out the batches of the uninterrupted one."""
    corpus = open_corpus(prepared_dir(tmp_path_factory), "train")
    straight = PretrainBatches(corpus, seed=5)
    straight.set_mask_prob(0.4)
    first = [straight.next_batch(64, 4) for _ in range(3)]
    state = straight.state_dict()
    rest = [straight.next_batch(64, 4) for _ in range(3)]
    resumed = PretrainBatches(corpus, seed=5)
    resumed.load_state_dict(state)
    resumed.set_mask_prob(0.4)
    for a, b in zip(rest, [resumed.next_batch(64, 4) for _ in range(3)]):
        assert all(torch.equal(a[k], b[k]) for k in a)
    chosen = sum(int((b["labels"] != -100).sum()) for b in first + rest)
    maskable = sum(int((torch.where(b["labels"] != -100, b["labels"], b["input_ids"]) >= NUM_SPECIAL_IDS).sum())
                   for b in first + rest)
    assert abs(chosen / maskable - 0.4) < 0.02
    # None = the reader's own rate: the batches of a reader that never changed it.
    resumed.set_mask_prob(None)
    plain = PretrainBatches(corpus, seed=5)
    plain.load_state_dict(resumed.state_dict())
    a, b = resumed.next_batch(64, 4), plain.next_batch(64, 4)
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(DataError, match="mask_prob"):
        resumed.set_mask_prob(1.0)


def test_sidecar_records_the_stage_fields_and_reads_old_ones():
    base = dict(tag="global_step4", step=4, stage_index=0, stage_name="a", step_in_stage=4, stage_complete=False,
                consumed_samples=16, consumed_tokens=100, last_validation={}, data_state={}, model_config={},
                world_size=2, loss_scale=1.0, skipped_steps=0, zero_stage=2, precision="fp32", total_steps=10)
    sidecar = CheckpointSidecar(**base, mask_prob=0.3, mixture={"en": 0.75, "zh": 0.25})
    again = CheckpointSidecar.from_dict(sidecar.to_dict(), where="x")
    assert again.mask_prob == 0.3 and again.mixture == {"en": 0.75, "zh": 0.25}
    old = CheckpointSidecar(**base).to_dict()
    assert "mask_prob" not in old and "mixture" not in old  # an older sidecar's keys, unchanged
    assert CheckpointSidecar.from_dict(old, where="x").mask_prob is None


# --- warmup-stable-decay ----------------------------------------------------------------------------------


@pytest.mark.parametrize("shape, mid", [("linear", 0.5), ("cosine", 0.5), ("1-sqrt", 1 - math.sqrt(0.5))])
def test_wsd_is_flat_then_falls_to_the_floor_at_the_last_step(shape, mid):
    total, warmup, window, floor = 100, 10, 20, 0.1
    lr = lambda step: learning_rate(step, total, 1.0, warmup, "wsd", floor, decay_steps=window,  # noqa: E731
                                    decay_shape=shape)
    assert lr(0) == pytest.approx(0.1) and lr(9) == pytest.approx(1.0)
    assert all(lr(step) == 1.0 for step in range(10, 80))  # stable until the window
    assert lr(80) < 1.0  # the window's first step is one step down
    assert lr(89) == pytest.approx(floor + (1 - floor) * mid)  # halfway: p = 10 / 20
    assert lr(99) == floor  # the last step of the run trains at exactly the floor
    values = [lr(step) for step in range(10, 100)]
    assert all(a >= b for a, b in zip(values, values[1:]))
    assert learning_rate(99, total, 1.0, warmup, "wsd", floor, lr_scale=0.5, decay_steps=window) == floor * 0.5


def test_wsd_window_defaults_to_the_last_stage_and_shape_to_1_sqrt(tmp_path):
    cfg = load_run_config(recipe_config(tmp_path, [{**STAGE, "steps": 30}, STAGE], decay="wsd"))
    assert cfg.decay_steps == 10 and cfg.learning_rate(29) == cfg.optimizer.lr
    assert cfg.learning_rate(34) == pytest.approx(cfg.optimizer.lr * (0.1 + 0.9 * (1 - math.sqrt(0.5))))
    assert cfg.to_dict()["optimizer"]["decay_steps"] == 0  # recorded as written (0 = the last stage's)
    # The curve from a recorded config.yaml's optimizer mapping (how a branch compares it with its source's).
    recorded = cfg.to_dict()["optimizer"]
    assert [run_learning_rate(s, recorded, [30, 10]) for s in range(40)] == [cfg.learning_rate(s) for s in range(40)]
    linear = load_run_config(recipe_config(tmp_path, [STAGE]))
    assert "decay_steps" not in linear.to_dict()["optimizer"]  # other decays record what they always did


@pytest.mark.parametrize("optimizer, message", [
    ({"decay": "wsd", "decay_steps": 19}, "optimizer.decay_steps: the decay window of 19 steps is longer than "
                                          "the run after warmup (20 steps - warmup_steps 2 = 18)"),
    ({"decay": "wsd", "warmup_steps": 15}, "optimizer.decay_steps: the decay window of 10 steps (not set: the "
                                           "last stage's steps, 10) is longer than the run after warmup"),
    ({"decay": "linear", "decay_steps": 5}, "optimizer.decay_steps: only applies to optimizer.decay: wsd"),
    ({"decay": "cosine", "decay_shape": "1-sqrt"}, "optimizer.decay_shape: only applies to optimizer.decay: wsd"),
    ({"decay": "wsd", "decay_shape": "sqrt"}, "optimizer.decay_shape: must be one of linear, cosine, 1-sqrt"),
    ({"decay": "wsd", "decay_steps": -3}, "optimizer.decay_steps: must be >= 1"),
])
def test_bad_wsd_settings_exit_2_in_one_line_naming_the_field(tmp_path, capsys, optimizer, message):
    path = recipe_config(tmp_path, [STAGE, STAGE], **optimizer)
    assert cli_main(["plan", "--config", str(path), "--world-size", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "run.yaml: " + message in err[0], err


# --- shipped recipes --------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [p for p in sorted(RECIPES.glob("*.yaml")) if not p.name.endswith("_schedule.yaml")],
                         ids=lambda p: p.name)
def test_every_shipped_recipe_loads_with_three_phases(path):
    cfg = load_run_config(path)
    stages = cfg.schedule.stages
    assert cfg.optimizer.decay == "wsd" and cfg.optimizer.decay_shape == "1-sqrt"
    assert len(stages) == 3 and stages[0].mask_prob > stages[-1].mask_prob  # the mask rate anneals
    assert stages[1].max_seq_len > stages[0].max_seq_len
    # Context extension raises the base to the model's, where the decay stays: the last checkpoint exports.
    thetas = [s.rope_theta for s in resolve_stages(cfg, 8 if "v100" in path.name else 2) if s.piece == 0]  # per stage
    assert thetas[0] < thetas[1] == thetas[2] == cfg.model.rope_theta == 10000.0
    assert stages[-1].mixture is not None and stages[-1].mixture != stages[0].mixture  # the mixture moves
    assert cfg.decay_steps == stages[-1].steps and cfg.learning_rate(cfg.schedule.total_steps - 1) == \
        pytest.approx(cfg.optimizer.lr * cfg.optimizer.min_lr_ratio)


def test_the_v100_recipe_is_planned_on_its_v100(monkeypatch, capsys, tmp_path):
    from tests.support.cpu_precision import pin_cpu_accelerator

    pin_cpu_accelerator(monkeypatch, fp16=False)
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    code = cli_main(["plan", "--config", str(RECIPES / "reference_v100_wsd.yaml"), "--world-size", "8",
                     "--set", f"data.data_dir={tmp_path / 'not-prepared'}"])
    out = capsys.readouterr().out
    assert code == 0
    assert "on V100 16 GiB (hardware.device)" in out and "DOES NOT FIT" not in out
    assert "mask_prob per stage: pretrain 0.3, extend 0.3, decay 0.15" in out
    assert "mixture per stage: pretrain zh 0.75, en 0.25; extend zh 0.75, en 0.25; decay zh 0.5, en 0.5" in out
    assert cli_main(["plan", "--config", str(RECIPES / "reference_v100_wsd.yaml"), "--world-size", "8", "--json",
                     "--set", f"data.data_dir={tmp_path / 'not-prepared'}"]) == 0
    stages = json.loads(capsys.readouterr().out)["stages"]
    assert [(s["mask_prob"], s["mixture"], s["rope_theta"]) for s in stages] == [
        (0.3, {"zh": 0.75, "en": 0.25}, 2500.0), (0.3, {"zh": 0.75, "en": 0.25}, 10000.0),
        (0.15, {"zh": 0.5, "en": 0.5}, 10000.0)]

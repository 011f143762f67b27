"""`micro_batch_size: auto` per stage (issue 48 item 4): the largest micro-batch that divides the per-rank batch
and whose planned memory (launcher/pricing/estimate.py) fits 85% of the target device; refused in one line where
not even one sequence fits; on a CPU target the schedule.max_tokens_per_micro_batch rule, said in the plan."""
from __future__ import annotations

import pytest

from launcher.common.errors import UserError
from launcher.config.deepspeed_json import read_ds_json
from launcher.config.run_config import load_run_config
from launcher.config.schedule import AUTO_MICRO, load_schedule
from launcher.config.stages import AUTO_MICRO_HEADROOM, MicroBatchTarget, format_plan, resolve_stages
from launcher.pricing.estimate import largest_fitting_micro_batch, setup_from_configs
from launcher.config.deepspeed_json import DeepSpeedJson
from launcher.resolved.run_stages import micro_batch_target, stages_at
from tests.support.cpu_precision import pin_cpu_accelerator
from tests.support.helpers import run_config_dict, write_schedule, write_yaml

BERT_BASE = dict(vocab_size=32000, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072)
WORLD = 8


def _cfg(tmp_path, stages, device="V100-16GB", ds_config="v100_fp16_zero2.json", model=BERT_BASE, **schedule):
    raw = run_config_dict(schedule_file=write_schedule(tmp_path / "sched.yaml", stages), ds_config=ds_config,
                          **({"hardware": {"device": device}} if device else {}))
    raw["model"].update(model)
    raw["schedule"].update(schedule)
    return load_run_config(write_yaml(tmp_path / "run.yaml", raw))


def _by_formula(cfg, seq_len: int, per_rank: int, device_bytes: int) -> int:
    """largest_fitting_micro_batch directly, restricted to the divisors of the per-rank batch."""
    ds_json = DeepSpeedJson.from_config(*read_ds_json(cfg.deepspeed.config))
    setup = setup_from_configs(cfg.model, ds_json, WORLD, cfg.schedule.activation_checkpointing, cpu_ranks=False)
    largest = largest_fitting_micro_batch(setup, seq_len, int(0.85 * device_bytes), setup.activation_checkpointing)
    return max(d for d in range(1, min(largest, per_rank) + 1) if per_rank % d == 0)


@pytest.mark.parametrize("device, ds_config", [("V100-16GB", "v100_fp16_zero2.json"),
                                               ("A100-80GB", "cpu_bf16_zero2.json")])
def test_auto_picks_the_formulas_largest_divisor_on_a_declared_device(tmp_path, device, ds_config):
    stages = [{"name": "short", "max_seq_len": 128, "global_batch_size": WORLD * 3000, "steps": 2,
               "micro_batch_size": "auto"},
              {"name": "long", "max_seq_len": 512, "global_batch_size": WORLD * 960, "steps": 2,
               "micro_batch_size": "auto"},
              {"name": "fixed", "max_seq_len": 512, "global_batch_size": WORLD * 96, "steps": 2,
               "micro_batch_size": 4}]
    cfg = _cfg(tmp_path, stages, device=device, ds_config=ds_config)
    assert AUTO_MICRO_HEADROOM == 0.85
    target = micro_batch_target(cfg, WORLD, DeepSpeedJson.of(cfg))
    assert target.device_bytes == cfg.hardware.memory_bytes and "(hardware.device)" in target.label
    short, long, fixed = resolve_stages(cfg, WORLD, target)
    for resolved, per_rank in ((short, 3000), (long, 960)):
        expected = _by_formula(cfg, resolved.max_seq_len, per_rank, cfg.hardware.memory_bytes)
        assert resolved.micro_batch_size == expected and 1 <= expected < per_rank  # the memory bound, not the batch
        assert resolved.grad_accum_steps * expected == per_rank
        assert resolved.micro_batch_note.startswith(f"auto: largest fitting 85% of {target.label}: ")
        budget = 0.85 * cfg.hardware.memory_bytes  # the next divisor of the per-rank batch would not fit
        bigger = min(d for d in range(expected + 1, per_rank + 1) if per_rank % d == 0)
        assert target.plan.planned_bytes(expected, resolved.max_seq_len) <= budget
        assert target.plan.planned_bytes(bigger, resolved.max_seq_len) > budget
    assert fixed.micro_batch_size == 4 and not fixed.micro_batch_note
    assert short.micro_batch_size > long.micro_batch_size  # shorter sequences: more of them fit
    plan = format_plan([short, long, fixed], WORLD, cfg)
    assert f"stage 'short': micro {short.micro_batch_size} (auto: largest fitting 85% of {target.label}: " in plan
    assert "GiB planned)" in plan and "stage 'fixed': micro" not in plan
    assert "micro_batch_note" not in short.to_dict()  # stages.json rows as before


def test_a_larger_device_fits_more(tmp_path):
    stages = [{"name": "long", "max_seq_len": 512, "global_batch_size": WORLD * 1024, "steps": 2,
               "micro_batch_size": "auto"}]
    small = stages_at(cfg := _cfg(tmp_path, stages, "V100-16GB"), WORLD, DeepSpeedJson.of(cfg))[0]
    large = stages_at(cfg := _cfg(tmp_path, stages, "V100-32GB"), WORLD, DeepSpeedJson.of(cfg))[0]
    assert large.micro_batch_size > small.micro_batch_size


def test_nothing_fits_is_refused_in_one_line_naming_the_stage(tmp_path):
    huge = {**BERT_BASE, "hidden_size": 4096, "num_hidden_layers": 48, "num_attention_heads": 32,
            "intermediate_size": 16384}
    stages = [{"name": "long", "max_seq_len": 512, "global_batch_size": WORLD, "steps": 2, "micro_batch_size": "auto"}]
    cfg = _cfg(tmp_path, stages, "V100-16GB", model=huge)
    with pytest.raises(UserError) as err:
        stages_at(cfg, WORLD, DeepSpeedJson.of(cfg))
    message = str(err.value)
    assert "\n" not in message
    assert "sched.yaml: stage 1 (long): micro_batch_size auto: not even one sequence of max_seq_len 512 fits 85% of " \
           "16 GiB V100 (hardware.device)" in message


def test_a_cpu_target_falls_back_to_the_token_budget_and_says_so(tmp_path):
    stages = [{"name": "s", "max_seq_len": 32, "global_batch_size": 16, "steps": 2, "micro_batch_size": "auto"}]
    cfg = _cfg(tmp_path, stages, device="", ds_config="cpu_fp32_zero2.json", model={}, max_tokens_per_micro_batch=128)
    target = micro_batch_target(cfg, 2, DeepSpeedJson.of(cfg))  # this machine: DeepSpeed's CPU accelerator here
    assert target == MicroBatchTarget("this machine: cpu") and target.plan is None
    resolved = resolve_stages(cfg, 2, target)[0]
    assert resolved.micro_batch_size == 4  # 4 x 32 = 128 tokens, a divisor of 8 per rank
    assert "micro 4 (auto: this machine: cpu has no accelerator memory to plan against: " \
           "schedule.max_tokens_per_micro_batch 128's rule" in format_plan([resolved], 2)
    no_budget = _cfg(tmp_path, stages, device="", ds_config="cpu_fp32_zero2.json", model={},
                     max_tokens_per_micro_batch=0)
    with pytest.raises(UserError, match=r"stage 1 \(s\): micro_batch_size auto on this machine: cpu .* needs "
                                        r"schedule.max_tokens_per_micro_batch > 0, or declare hardware.device"):
        resolve_stages(no_budget, 2, MicroBatchTarget("this machine: cpu"))


def test_auto_without_a_target_is_a_programming_error(tmp_path):
    stages = [{"name": "s", "max_seq_len": 32, "global_batch_size": 16, "steps": 2, "micro_batch_size": "auto"}]
    cfg = _cfg(tmp_path, stages, device="", ds_config="cpu_fp32_zero2.json", model={})
    with pytest.raises(ValueError, match="pass micro_target"):
        resolve_stages(cfg, 2)
    fixed = _cfg(tmp_path, [{**stages[0], "micro_batch_size": 2}], device="", model={}, ds_config="cpu_fp32_zero2.json")
    assert micro_batch_target(fixed, 2, DeepSpeedJson.of(fixed)) is None  # no target without auto


def test_auto_parses_and_a_bad_string_names_file_and_stage(tmp_path):
    good = [{"name": "a", "max_seq_len": 32, "global_batch_size": 8, "steps": 1, "micro_batch_size": "auto"}]
    assert load_schedule(write_schedule(tmp_path / "good.yaml", good))[0].micro_batch_size == AUTO_MICRO
    for bad in ("big", "Auto", ""):
        path = write_schedule(tmp_path / "bad.yaml", [good[0], {**good[0], "name": "b", "micro_batch_size": bad}])
        with pytest.raises(UserError, match=r"bad\.yaml: stage 2 \(b\): micro_batch_size must be a positive integer "
                                            r"or 'auto', got"):
            load_schedule(path)


def test_plan_prints_the_choice(tmp_path, capsys, monkeypatch):
    """`roformer plan` on a declared V100 target from a login node (a CPU without fp16, DS_ACCELERATOR unset as a GPU
    user has it; pinned, so the test does not depend on this machine's CPU; no data yet: the data checks are a note)."""
    from launcher.cli import main as cli_main

    pin_cpu_accelerator(monkeypatch, fp16=False)
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    stages = [{"name": "long", "max_seq_len": 512, "global_batch_size": WORLD * 64, "steps": 2,
               "micro_batch_size": "auto"}]
    cfg = _cfg(tmp_path, stages)
    assert cli_main(["plan", "--config", str(cfg.source), "--world-size", str(WORLD)]) == 0
    out = capsys.readouterr().out
    chosen = stages_at(cfg, WORLD, DeepSpeedJson.of(cfg))[0]
    assert f"stage 'long': micro {chosen.micro_batch_size} (auto: largest fitting 85% of 16 GiB V100 " \
           f"(hardware.device): " in out
    assert f"{chosen.micro_batch_size} x 512" in out  # the memory table prices the chosen micro-batch

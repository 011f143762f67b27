"""launcher.pricing.estimate (what `roformer plan` prints about memory and time): DeepSpeed's own
model-state estimators, the activation formula by hand, FITS / DOES NOT FIT and the largest micro-batch."""
from __future__ import annotations

import json

import pytest

from launcher.pricing.estimate import (
    GIB,
    TrainingSetup,
    activation_bytes,
    estimate_memory,
    estimate_stages,
    format_estimates,
    largest_fitting_micro_batch,
    model_state_bytes,
    parse_memory,
    step_seconds,
)
from launcher.config.stages import ResolvedStage
from roformer import RoFormerConfig
from roformer.flops import parameter_count, training_flops

BASE = RoFormerConfig(vocab_size=32000, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                      intermediate_size=3072)


def setup(**changes) -> TrainingSetup:
    values = dict(model=BASE, world_size=8, zero_stage=2, precision="fp16", offload_optimizer=False,
                  reduce_bucket_elements=200_000_000, overlap_comm=True, activation_checkpointing=False)
    return TrainingSetup(**{**values, **changes})


def stage(name, micro, length, steps=10, accum=1) -> ResolvedStage:
    return ResolvedStage(index=0, name=name, max_seq_len=length, global_batch_size=micro * accum * 8,
                         micro_batch_size=micro, grad_accum_steps=accum, steps=steps, first_step=0, lr_scale=1.0)


def test_model_states_are_deepspeeds_estimates():
    params = parameter_count(BASE)
    assert model_state_bytes(setup()) == 2 * params + int(18 * params / 8)  # ZeRO-2, 16-bit
    assert model_state_bytes(setup(zero_stage=1)) == 2 * params + int(18 * params / 8) + int(2 * params * 7 / 8)
    assert model_state_bytes(setup(precision="fp32")) == 4 * params + int(18 * params / 8) + int(2 * params / 8)
    assert model_state_bytes(setup(zero_stage=3)) < model_state_bytes(setup())


def test_activations_by_hand_and_checkpointing_keeps_less():
    small = RoFormerConfig(vocab_size=100, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=16)  # dropout 0.1 / 0.1 (the defaults)
    b, s = 2, 4
    common = 2 * (8 * s * b * 8 + 2 * s * b * 16) + 2 * s * b * 8  # fp16 elements + hidden dropout masks
    outside = 2 * s * b * (8 + 8) + 0.15 * b * s * (2 * 2 * 8 + 4 * 2 * 100)
    for cpu_ranks, scores in ((False, 4 * 2 * s * b), (True, 2 * s * s * b)):  # row floats / 1-byte keep mask
        layer = common + scores
        assert activation_bytes(small, b, s, "fp16", False, cpu_ranks) == int(2 * layer + outside)
        assert activation_bytes(small, b, s, "fp16", True, cpu_ranks) == int(2 * 2 * s * b * 8 + layer + outside)
    # BERT-base at 16 x 512 in fp16 with fused attention: Korthikanti's 34 s b h per layer without his
    # 5 a s^2 b of materialised scores (2.4 GiB for 12 layers), plus the MLM head's fp32 logits
    head = 0.15 * 16 * 512 * 4 * 2 * 32000
    assert activation_bytes(BASE, 16, 512, "fp16", False) / GIB == pytest.approx(
        (12 * 34 * 512 * 16 * 768 + head) / GIB, rel=0.02)


def test_the_optimizer_step_temporaries_count_where_they_exceed_the_activations():
    params = parameter_count(BASE)
    torch_adam = setup(precision="fp32", torch_optimizer=True)
    assert estimate_memory(setup(), 1, 128).optimizer_step == 0  # DeepSpeed's fused Adam
    estimate = estimate_memory(torch_adam, 1, 128)
    assert estimate.optimizer_step == 8 * params // 8  # two fp32 copies of the rank's 1/8 partition
    assert estimate.optimizer_step > estimate.activations
    assert estimate.total == estimate.model_states + estimate.buckets + estimate.optimizer_step + estimate.runtime
    large = estimate_memory(torch_adam, 64, 512)
    assert large.total == large.model_states + large.buckets + large.activations + large.runtime


def test_a_stage_that_cannot_fit_is_flagged_with_the_largest_micro_batch_that_fits():
    stages = [stage("short", 16, 128), stage("long", 64, 1536)]
    estimates = estimate_stages(stages, setup(), 16 * GIB, 125.0, 0.4)
    assert [e.fits for e in estimates] == [True, False]
    text = format_estimates(estimates, setup(), 16 * GIB, 125.0, "table: V100 fp16", 0.4)
    short, long = (line for line in text.splitlines() if line.strip().startswith(("short", "long")))
    assert "FITS" in short and "DOES NOT FIT" not in short
    assert "DOES NOT FIT" in long
    best = largest_fitting_micro_batch(setup(), 1536, 16 * GIB, checkpointing=False)
    assert 0 < best < 64 and f"{best:>10}" in long
    assert estimate_memory(setup(), best, 1536).total <= 16 * GIB < estimate_memory(setup(), best + 1, 1536).total
    assert largest_fitting_micro_batch(setup(), 1536, 16 * GIB, checkpointing=True) > best
    assert largest_fitting_micro_batch(setup(), 512, GIB // 2, checkpointing=True) == 0  # not one sequence


def test_time_is_flops_over_peak_times_mfu():
    seconds = step_seconds(BASE, 16, 2, 512, checkpointing=False, peak_tflops=125.0, mfu=0.5)
    assert seconds == pytest.approx(2 * training_flops(BASE, 16, 512, 0.15 * 16 * 512) / 62.5e12)
    assert step_seconds(BASE, 16, 2, 512, True, 125.0, 0.5) > seconds  # the recomputed forward


def test_memory_sizes():
    assert parse_memory("16GB") == 16 * GIB == parse_memory("16 GiB")
    assert parse_memory("800MB") == 800 * 2 ** 20
    with pytest.raises(ValueError, match="--device-memory"):
        parse_memory("lots")


def test_plan_on_a_hostfile_flags_the_stage_that_cannot_fit(tiny_data, tmp_path, monkeypatch, capsys):
    """`roformer plan --hostfile` (2 nodes x 4 slots): world size 8 everywhere, JSON and text alike; a
    stage whose micro-batch is too big for --device-memory is DOES NOT FIT, the small one FITS."""
    from launcher.cli import main as cli_main
    from launcher.config.deepspeed_json import DeepSpeedJson
    from launcher.pricing.estimate import setup_from_configs
    from launcher.config.run_config import load_run_config
    from launcher.config.stages import resolve_stages
    from tests.support.helpers import tiny_run_config

    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# two nodes\nnode-a slots=4\nnode-b slots=4\n")
    stages = [{"name": "small", "max_seq_len": 32, "global_batch_size": 8, "micro_batch_size": 1, "steps": 3},
              {"name": "huge", "max_seq_len": 64, "global_batch_size": 256, "micro_batch_size": 32, "steps": 2}]
    config = tiny_run_config(tmp_path, tiny_data, stages=stages)
    # A device between the two stages' estimates (the estimator's figures are tested above).
    cfg = load_run_config(config)
    tiny = setup_from_configs(cfg.model, DeepSpeedJson.of(cfg), 8, False, cpu_ranks=True)
    small, huge = estimate_memory(tiny, 1, 32).total, estimate_memory(tiny, 32, 64).total
    assert huge > small
    device = f"{(small + huge) // 2 // 2 ** 20}MB"
    args = ["plan", "--config", str(config), "--hostfile", str(hostfile), "--device-memory", device, "--peak-tflops", "1"]

    assert cli_main([*args, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["world_size"] == 8 and plan["deepspeed"]["train_batch_size"] == 8
    assert [(s["micro_batch_size"], s["grad_accum_steps"]) for s in plan["stages"]] == [(1, 1), (32, 1)]
    estimate = plan["estimate"]
    assert estimate["device_memory_bytes"] == parse_memory(device) and not estimate["all_fit"]
    assert [(s["name"], s["verdict"]) for s in estimate["stages"]] == [("small", "FITS"), ("huge", "DOES NOT FIT")]
    small_json, huge_json = estimate["stages"]
    assert small_json["memory_bytes"]["total"] == small and huge_json["memory_bytes"]["total"] == huge
    assert 1 <= huge_json["largest_micro_batch"] < 32
    assert huge_json["seconds"] > 0 and estimate["total_seconds"] == pytest.approx(
        small_json["seconds"] + huge_json["seconds"])

    assert cli_main(args) == 0
    text = capsys.readouterr().out
    assert "8 ranks" in text
    rows = {line.split()[0]: line for line in text.splitlines() if line.strip().startswith(("small ", "huge "))}
    assert "FITS" in rows["small"] and "DOES NOT FIT" not in rows["small"] and "DOES NOT FIT" in rows["huge"]

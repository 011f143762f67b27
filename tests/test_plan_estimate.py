"""launcher.config.estimate (what `roformer plan` prints about memory and time): DeepSpeed's own
model-state estimators, the activation formula by hand, FITS / DOES NOT FIT and the largest micro-batch."""
from __future__ import annotations

import pytest

from launcher.config.estimate import (GIB, activation_bytes, estimate_memory, format_estimates,
                                      largest_fitting_micro_batch, model_state_bytes, parse_memory, step_seconds,
                                      TrainingSetup)
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
    layer = 2 * (8 * s * b * 8 + 2 * s * b * 16 + 2 * 2 * s * s * b) + 2 * s * b * 8 + 2 * s * s * b
    outside = 2 * s * b * (8 + 8) + 0.15 * b * s * (2 * 2 * 8 + 4 * 2 * 100)
    assert activation_bytes(small, b, s, "fp16", checkpointing=False) == int(2 * layer + outside)
    assert activation_bytes(small, b, s, "fp16", checkpointing=True) == int(2 * 2 * s * b * 8 + layer + outside)
    # BERT-base at 16 x 512 in fp16: Korthikanti's 34 s b h + 5 a s^2 b per layer, ~5.5 GiB for 12 layers
    assert activation_bytes(BASE, 16, 512, "fp16", False) / GIB == pytest.approx(
        12 * (34 * 512 * 16 * 768 + 5 * 12 * 512 ** 2 * 16) / GIB, rel=0.1)


def test_a_stage_that_cannot_fit_is_flagged_with_the_largest_micro_batch_that_fits():
    stages = [stage("short", 16, 128), stage("long", 64, 1536)]
    text, all_fit = format_estimates(stages, setup(), 16 * GIB, 125.0, "table: V100 fp16", 0.4)
    assert not all_fit
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

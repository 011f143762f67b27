"""The V100 fp16 path on CPU: dynamic loss scaling, overflow skips, resume. On a CPU whose DeepSpeed
accelerator has fp16 (a Xeon with AVX512-FP16 / AMX) the ranks run it as they are; elsewhere the ranks
report fp16 support (tests/support/fp16_cpu.py) so that the same real fp16 optimizer runs.

The shipped v100_fp16_zero2.json runs with two test overrides: torch's AdamW (FusedAdam would
compile for minutes on CPU) and a loss scale that starts far too high with a short growth window,
so overflows (skipped steps) happen at the start and again later, on both sides of a SIGTERM stop
(the stopped run is the session's `fp16_stopped_run`, tests/multirank/conftest.py, resumed here).
The last test pins down what DeepSpeed's fp16 optimizer does on a step where the scale grows
(docs/training.md, "fp16: the step where the loss scale grows").
"""
from __future__ import annotations

import json
import math
import shutil

import pytest

from launcher.train.metrics import read_metrics
from tests.support.fp16_cpu import fp16_rank_env
from tests.support.helpers import (
    newest_checkpoint,
    REPO,
    TEST_RANK_ENTRY,
    TINY_TOTAL_STEPS,
    fork_server,
    free_port,
    rank_env,
    start_run,
)


@pytest.fixture(scope="module")
def fp16_run(tmp_path_factory, fp16_stopped_run):
    """The session's fp16 run stopped at step 7 (tests/multirank/conftest.py), copied and resumed to the end."""
    config, stopped_dir = fp16_stopped_run
    run_dir = tmp_path_factory.mktemp("fp16") / "run"
    shutil.copytree(stopped_dir, run_dir)
    stop_point = newest_checkpoint(run_dir)
    before = {r["step"]: r for r in read_metrics(run_dir, "train")}
    resumed = start_run(2, config, run_dir, module=TEST_RANK_ENTRY, **fp16_rank_env())
    assert resumed.wait(timeout=240) == 0, (run_dir.parent / "run.log").read_text()[-4000:]
    return run_dir, stop_point, before


def test_overflow_steps_are_skipped_and_logged(fp16_run):
    run_dir, _, _ = fp16_run
    train = read_metrics(run_dir, "train")
    assert [r["step"] for r in train] == list(range(1, TINY_TOTAL_STEPS + 1))
    skipped = [r["skipped_steps"] for r in train]
    scales = [r["loss_scale"] for r in train]
    assert skipped[0] == 1 and scales[0] == 2.0 ** 23  # 2^24 overflows at once and is halved
    assert skipped == sorted(skipped) and skipped[-1] > skipped[0]
    for prev, cur, s_prev, s_cur in zip(skipped, skipped[1:], scales, scales[1:]):
        if cur > prev:
            assert s_cur == s_prev / 2  # every skipped step halves the scale (hysteresis 1)
    assert any(b > a for a, b in zip(scales, scales[1:]))  # and it grows again after good windows
    assert all(math.isfinite(r["loss"]) for r in train)
    assert train[-1]["loss"] < train[0]["loss"]
    assert newest_checkpoint(run_dir).sidecar.precision == "fp16"


def test_loss_scale_and_skip_count_survive_resume(fp16_run):
    run_dir, stop_point, before = fp16_run
    sidecar = stop_point.sidecar
    last = before[sidecar.step]  # the checkpoint's last step
    assert (sidecar.loss_scale, sidecar.skipped_steps) == (last["loss_scale"], last["skipped_steps"])
    resume = [r for r in read_metrics(run_dir, "event") if r["event"] == "resume"][-1]
    assert (resume["loss_scale"], resume["skipped_steps"]) == (sidecar.loss_scale, sidecar.skipped_steps)
    first = {r["step"]: r for r in read_metrics(run_dir, "train")}[sidecar.step + 1]  # the first step after it
    assert first["loss_scale"] in (sidecar.loss_scale, sidecar.loss_scale / 2, sidecar.loss_scale * 2)
    assert first["skipped_steps"] - sidecar.skipped_steps in (0, 1)


def test_tensorboard_has_loss_scale_and_skips(fp16_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, _, _ = fp16_run
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    scales = {e.step: e.value for e in acc.Scalars("train/loss_scale")}
    skipped = {e.step: e.value for e in acc.Scalars("train/skipped_steps")}
    train = read_metrics(run_dir, "train")
    assert sorted(scales) == list(range(1, TINY_TOTAL_STEPS + 1))  # purge_step dropped the stopped run's extra steps
    assert [scales[r["step"]] for r in train] == [r["loss_scale"] for r in train]
    assert [skipped[r["step"]] for r in train] == [r["skipped_steps"] for r in train]


@pytest.mark.parametrize("zero_stage", [1, 2])
def test_a_loss_scale_growth_step_applies_half_the_gradient(zero_stage, tmp_path):
    """DeepSpeed's ZeRO-1/2 fp16 step (runtime/zero/stage_1_and_2.py, step()) updates the dynamic loss
    scale before it unscales the gradients, so on a step where the scale doubles the gradient is
    divided by twice the scale it was multiplied with: that step applies half of it (once per
    loss_scale_window overflow-free steps). Measured with SGD on a constant gradient
    (tests/support/loss_scale_probe.py, one rank forked from the session's warm process: no launcher or
    interpreter start-up). A DeepSpeed upgrade that changes this fails here: update docs/training.md and this test."""
    import deepspeed

    log = tmp_path / "probe.log"
    probe = fork_server().start(1, "tests.support.loss_scale_probe", [str(zero_stage), "7"], free_port(), rank_env(),
                                REPO, log)
    assert probe.wait(timeout=600) == 0, log.read_text()[-3000:]
    steps = [json.loads(line) for line in log.read_text().splitlines() if line.startswith('{"step"')]
    assert [r["step"] for r in steps] == list(range(7))
    grew = [r["step"] for r in steps if r["scale_after"] == 2 * r["scale_before"]]
    assert grew == [2, 4, 6]  # scale 16, growth every 2 overflow-free steps, no overflow
    applied = {r["step"]: r["applied"] for r in steps}
    expected = {step: [0.5] if step in grew else [1.0] for step in applied}
    assert applied == expected, f"DeepSpeed {deepspeed.__version__}: fraction of the gradient applied per step"

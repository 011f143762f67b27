"""`roformer gpu-check` without a GPU: the refusal (one line, exit 2), and everything it decides and prints
from measurements (launcher/gpu_check/check_report.py): tolerance verdicts, the resume and overflow checks on
metrics rows, measured memory against `roformer plan`'s estimate, the JSON report and the console table.
The GPU parts themselves are tests/gpu/ (marked `gpu`; skipped, saying why, without CUDA)."""
from __future__ import annotations

import json
import math

import pytest
import torch

from launcher.pricing.estimate import estimate_memory, setup_from_configs
from launcher.gpu_check import check_report as gpu_report
from launcher.gpu_check.check_report import (Check, GpuCheckReport, SpeedRow, memory_check, overflow_check, resume_checks,
                                       tolerance_check)
from launcher.gpu_check.side_by_side import round_robin
from tests.support.helpers import REPO, in_process_cli


@pytest.fixture
def cli(monkeypatch, capsys):
    return in_process_cli(monkeypatch, capsys)


def test_without_cuda_it_says_so_in_one_line_and_exits_2(cli, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, out, err = cli("gpu-check", "--out", str(tmp_path / "report.json"))
    assert code == 2 and out == ""
    assert err.splitlines() == [f"roformer gpu-check: no CUDA device here (torch {torch.__version__}, "
                                f"{'a CUDA ' + torch.version.cuda + ' build' if torch.version.cuda else 'a CPU-only build'})"
                                ": nothing to check; run it on a GPU machine (TORCH_VARIANT=cuda make setup installs a "
                                "CUDA torch)"]
    assert not (tmp_path / "report.json").exists() and not (tmp_path / "work").exists()


def test_bad_parts_are_named(cli):
    code, _, err = cli("gpu-check", "--parts", "numerics,warp-drive")
    assert code == 2 and "--parts: unknown part(s) warp-drive (known: numerics, pretraining, speed, memory, profile)" in err


@pytest.mark.parametrize("key, diff, scale, passed", [
    ("fp16_logits", 0.05, 10.0, True),       # 0.005 <= 0.01
    ("fp16_logits", 0.2, 10.0, False),       # 0.02 > 0.01
    ("fp32_logits", 5e-4, 10.0, True),
    ("bf16_grads", math.nan, 1.0, False),    # NaN never passes
    ("fp32_grads", 1e-9, 0.0, True),         # an all-zero reference: the absolute difference
])
def test_tolerance_verdicts(key, diff, scale, passed):
    check = tolerance_check("numerics", "x", key, diff, scale)
    assert check.passed is passed and check.limit == f"<= {gpu_report.TOLERANCES[key]:g}"
    assert check.verdict == ("ok" if passed else "FAIL")


def row(step, loss, **fields):
    return {"kind": "train", "step": step, "loss": loss, "lr": 1e-4 * step, "loss_scale": 2.0 ** 23,
            "skipped_steps": 2, "masked_tokens": 100 + step, "max_seq_len": 64, **fields}


def test_resume_checks_compare_the_steps_after_the_stop():
    whole = [row(step, 5.0 - step / 10) for step in range(1, 9)]
    resumed = [row(step, 5.0 - step / 10 + 1e-5) for step in range(5, 9)]
    checks = resume_checks(whole, resumed, stop_step=4)
    assert [c.passed for c in checks] == [True, True] and checks[1].value < 1e-5
    # A different data position shows as unequal masked-token counts, named by step.
    moved = [row(step, 5.0 - step / 10, masked_tokens=999) for step in range(5, 9)]
    exact, losses = resume_checks(whole, moved, stop_step=4)
    assert exact.passed is False and "step 5 masked_tokens" in exact.detail and losses.passed
    drifted = [row(step, 6.0) for step in range(5, 9)]
    assert resume_checks(whole, drifted, stop_step=4)[1].passed is False
    nothing = resume_checks(whole, [], stop_step=4)
    assert len(nothing) == 1 and nothing[0].passed is False


def test_overflow_check_needs_a_skipped_step_and_a_changed_scale():
    rows = [row(1, 5.0, skipped_steps=1, loss_scale=2.0 ** 23), row(2, 5.0, skipped_steps=1, loss_scale=2.0 ** 23),
            row(3, 4.0, skipped_steps=1, loss_scale=2.0 ** 22)]
    assert overflow_check(rows).passed is True
    assert overflow_check([row(1, 5.0, skipped_steps=0, loss_scale=65536.0)]).passed is False


def test_measured_memory_is_judged_against_the_plans_estimate_for_the_same_stage():
    """The estimate gpu-check compares with is `roformer plan`'s for the reference DeepSpeed config at
    world size 1 (model-dependent part); the verdict range allows the estimate to err towards safety."""
    from launcher.gpu_check.speed_memory import REFERENCE_MODEL

    ds_config = json.loads((REPO / "ds_configs" / "v100_fp16_zero2.json").read_text())
    from launcher.config.deepspeed_json import DeepSpeedJson

    setup = setup_from_configs(REFERENCE_MODEL, DeepSpeedJson.from_config(ds_config), 1, activation_checkpointing=False,
                               cpu_ranks=False)
    estimate = estimate_memory(setup, 16, 512).model_dependent
    assert estimate > 2 * 2 ** 30  # 110M parameters' fp16 ZeRO states alone are ~1.8 GB
    assert memory_check("16 x 512", int(0.9 * estimate), estimate).passed is True
    assert memory_check("16 x 512", int(1.2 * estimate), estimate).passed is False  # plan said FITS wrongly
    assert memory_check("16 x 512", int(0.5 * estimate), estimate).passed is False  # plan far too cautious
    assert "plan" in memory_check("16 x 512", estimate, estimate).detail


def test_report_json_and_console_table():
    speed = SpeedRow(seq_len=512, batch_size=16, precision="bf16", ours_s=0.05, transformers_s=0.1, model_flops=2e13,
                     peak_tflops=989.0)
    report = GpuCheckReport({"name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "memory_gib": 79.6, "count": 8,
                             "torch": "2.13.0+cu128", "cuda": "12.8"},
                            checks=[tolerance_check("numerics", "fp16 logits vs our fp32", "fp16_logits", 0.01, 10.0),
                                    Check("numerics", "bf16: not on this GPU", None)],
                            speed=[speed])
    assert report.passed
    data = report.to_dict()
    figures = data["speed"][0]
    assert figures["ours_tokens_per_s"] == pytest.approx(8192 / 0.05) and figures["speedup"] == pytest.approx(2.0)
    assert figures["ours_mfu"] == pytest.approx(2e13 / 0.05 / 989e12)
    assert [c["verdict"] for c in data["checks"]] == ["ok", "-"] and json.loads(json.dumps(data)) == data
    table = report.table().splitlines()
    assert table[0].startswith("gpu-check on 8 x NVIDIA H100 80GB HBM3 (compute capability 9.0, 80 GiB")
    assert any("512 x 16 bf16" in line and "163,840" in line and "2.00x" in line and "40.4%" in line for line in table)
    assert table[-1] == "gpu-check: PASSED"
    report.errors.append("memory: RuntimeError: CUDA out of memory")
    assert not report.passed and report.table().splitlines()[-2:] == [
        "  ERROR memory: RuntimeError: CUDA out of memory", "gpu-check: FAILED"]


def test_round_robin_synchronizes_around_every_timed_step():
    """The clock is read only after the device finished: synchronize before and after each timed step."""
    events: list[str] = []
    steps = {"a": lambda: events.append("a"), "b": lambda: events.append("b")}
    samples = round_robin(steps, iters=2, warmup=1, synchronize=lambda: events.append("sync"),
                          between={"probe": lambda: events.append("probe") or 1.0})
    assert events == ["a", "b"] + ["probe", "sync", "a", "sync", "sync", "b", "sync"] * 2
    assert {k: len(v) for k, v in samples.items()} == {"probe": 2, "a_wall_s": 2, "a_cpu_s": 2, "b_wall_s": 2,
                                                       "b_cpu_s": 2}

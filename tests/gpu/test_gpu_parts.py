"""The parts of `roformer gpu-check` (launcher/gpu_check/) as ordinary tests, on this machine's CUDA
devices. Marked `gpu` by folder (tests/conftest.py) and skipped, saying why, where CUDA is absent:
they are never counted as coverage on a CPU machine."""
from __future__ import annotations

import torch

from launcher.gpu_check.numerics import check_numerics
from launcher.gpu_check.pretraining import check_pretraining
from launcher.gpu_check.speed_memory import check_memory, check_speed

DEVICE = torch.device("cuda", 0)


def failed(checks) -> list[str]:
    return [f"{c.name}: {c.value} (limit {c.limit}) {c.detail}" for c in checks if c.passed is False]


def test_numerics_fp16_bf16_against_fp32_and_transformers():
    checks = check_numerics(DEVICE)
    assert not failed(checks)
    assert any(c.name.startswith("fp16 logits vs transformers") for c in checks)


def test_fp16_zero2_pretraining_skips_an_overflow_resumes_exactly_and_exports(tmp_path):
    checks = check_pretraining(tmp_path, torch.cuda.device_count())
    assert not failed(checks)
    assert {c.name for c in checks} >= {"fp16 overflow step skipped and counted",
                                        "export loaded by transformers (finite logits)"}


def test_speed_side_by_side_at_128_and_512():
    rows = check_speed(DEVICE, iters=3)
    assert [row.seq_len for row in rows] == [128, 512]
    for row in rows:
        figures = row.figures()
        assert figures["ours_tokens_per_s"] > 0 and figures["transformers_tokens_per_s"] > 0


def test_peak_memory_within_the_plans_estimate():
    check = check_memory(DEVICE)
    assert check.passed, check.detail

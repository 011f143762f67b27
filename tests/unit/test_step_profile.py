"""`roformer gpu-check`'s profile part (launcher/gpu_check/step_profile.py) run through on CPU: a tiny model,
fp32, our model / transformers' / a real single-rank DeepSpeed engine side by side, one engine step under
torch.profiler; the rows the report prints and writes. The GPU figures come from the same code on a card."""
from __future__ import annotations

import json

import pytest
import torch

from launcher.gpu_check.check_report import GpuCheckReport
from launcher.gpu_check.step_profile import profile_steps
from roformer import RoFormerConfig
from tests.support.helpers import free_port

TINY = RoFormerConfig(vocab_size=200, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)


@pytest.fixture
def single_rank_env(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def test_the_profile_part_measures_three_steps_and_profiles_the_engines(single_rank_env):
    said = []
    rows = profile_steps(torch.device("cpu"), TINY, lengths=(16, 32), precisions=["fp32"], iters=2,
                         ds_json="cpu_fp32_zero2.json", reference_tokens=128, say=said.append)
    assert [(r.seq_len, r.micro_batch, r.precision) for r in rows] == [(16, 8, "fp32"), (32, 4, "fp32")]
    for row in rows:
        assert set(row.tokens_per_s) == {"ours", "transformers", "engine"}
        assert all(value > 0 for value in row.tokens_per_s.values())
        assert row.mfu == {}  # no table peak for a CPU
        kernels = [name for name, _ in row.profile.top_kernels]
        assert kernels and any(name.startswith("aten::") for name in kernels), kernels
        assert row.profile.attention == "ours (CPU)", kernels  # training on a CPU: roformer/cpu_kernels
    assert len(said) == 2 and "16 x 8" in said[0]
    report = GpuCheckReport({"name": "cpu"}, profile=rows)
    written = json.loads(json.dumps(report.to_dict()))
    assert [r["micro_batch"] for r in written["profile"]] == [8, 4]
    assert "fp32 16 x 8" in report.table()

"""launcher.common.mfu: the peak table, the per-step model FLOPs and the tflops / mfu fields of a train
record, against hand computations. The fields in a real run's metrics.jsonl: tests/multirank/test_training.py."""
from __future__ import annotations

import pytest

from launcher.common.mfu import (
    Peak,
    resolve_peak,
    speed_fields,
    step_model_flops,
    table_peak_tflops,
)
from roformer import RoFormerConfig

SMALL = dict(vocab_size=100, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=16)


def hand_step_flops(batch: int, length: int, masked: int) -> int:
    """3 x forward for SMALL (h 8, I 16, V 100, 2 layers, head size 4), written out term by term."""
    tokens = batch * length
    per_layer = 4 * 2 * tokens * 8 * 8 + 2 * 2 * tokens * 8 * 16 + 2 * 2 * batch * 2 * length * length * 4
    head = 2 * masked * 8 * 8 + 2 * masked * 8 * 100
    return 3 * (2 * per_layer + head)


def test_step_flops_sum_the_micro_batches_at_their_own_shapes():
    config = RoFormerConfig(**SMALL)
    # Two micro-batches of one step at different padded lengths and masked counts.
    micro = [(2, 4, 3), (3, 6, 5)]
    assert hand_step_flops(2, 4, 3) == 3 * (8192 + 8192 + 2048 + 5184)  # the numbers of tests/unit/test_flops.py
    assert step_model_flops(config, micro) == hand_step_flops(2, 4, 3) + hand_step_flops(3, 6, 5)


def test_tflops_and_mfu_of_a_step():
    peak = Peak(2.0, "run config", "test", "fp32")
    fields = speed_fields(3.0e12, 1.5, peak)  # 3 TFLOP in 1.5 s = 2 TFLOP/s = the whole peak
    assert fields == {"tflops": pytest.approx(2.0), "mfu": pytest.approx(1.0)}
    assert speed_fields(1.0e12, 2.0, peak)["mfu"] == pytest.approx(0.25)
    assert speed_fields(1.0e12, 2.0, Peak(None, "unknown", "x", "fp16"))["mfu"] is None


@pytest.mark.parametrize("name, precision, expected", [
    ("Tesla V100-SXM2-16GB", "fp16", 125.0), ("Tesla V100-SXM2-32GB", "fp32", 15.7),
    ("Tesla V100-PCIE-16GB", "bf16", None),  # no bf16 on V100
    ("NVIDIA A100-SXM4-80GB", "bf16", 312.0), ("NVIDIA A100-PCIE-40GB", "fp16", 312.0),
    ("NVIDIA H100 80GB HBM3", "bf16", 989.0), ("NVIDIA H100 PCIe", "fp16", 756.0),
    ("NVIDIA GeForce RTX 3090", "fp16", None)])
def test_peak_table(name, precision, expected):
    assert table_peak_tflops(name, precision) == expected


def test_run_config_peak_wins_and_cpu_peak_is_measured():
    assert resolve_peak(42.0, "fp16") == Peak(42.0, "run config", resolve_peak(42.0, "fp16").device, "fp16")
    measured = resolve_peak(0.0, "bf16")  # the tests run on the CPU accelerator
    assert measured.source == "measured" and measured.precision == "fp32"
    assert 1e-4 < measured.tflops < 100  # a real timing: above 0.1 GFLOP/s, below any CPU's reach


def test_measuring_the_cpu_peak_leaves_the_global_rng_alone():
    """Ranks measure the peak after restoring a checkpoint's RNG state: the dropout masks that follow
    must be those of the uninterrupted run (found by gpu-check's resume part on a CPU run with dropout)."""
    import torch

    from launcher.common.mfu import measure_matmul_tflops

    torch.manual_seed(3)
    before = torch.get_rng_state()
    assert measure_matmul_tflops(size=64, seconds=0.01) > 0
    assert torch.equal(torch.get_rng_state(), before)


def test_the_measured_mfu_table_is_the_bench_records():
    """MEASURED_MFU (what `roformer plan` prices time with) holds the MFU of bench/results' GPU records, row by row."""
    import json

    from launcher.common.mfu import MEASURED_MFU, plan_mfu
    from tests.support.helpers import REPO

    for device, precision, seq_len, mfu, record, date in MEASURED_MFU:
        path, _, section = record.partition(" (")
        data = json.loads((REPO / path).read_text())
        rows = [row for row in data[section.rstrip(")")]["speed"]
                if row["seq_len"] == seq_len and row["precision"] == precision]
        assert data["date"] == date and device in data["machine"].lower()
        assert [round(row["ours_mfu"], 4) for row in rows] == [mfu]
    assert plan_mfu("NVIDIA H200", "bf16").at(1536) == plan_mfu("H200", "bf16").at(512) == 0.0815
    assert plan_mfu("Tesla V100-SXM2-16GB", "fp16").source.startswith("assumed")
    assert plan_mfu("H200", "bf16", override=0.3).label == "30% MFU (--mfu)"

"""The GPU paths, checked on a CPU machine (docs/gpu.md): the CPU-only dropout / attention-dropout kernels
are never chosen for a tensor that is not on the CPU (the 'meta' device stands in for a GPU: it has a
device type other than cpu and runs the same dispatch), batches go to an accelerator from pinned host
memory without a padding-free mask, and the GPU DeepSpeed configs get DeepSpeed's fused Adam."""
from __future__ import annotations

import json

import pytest
import torch

import roformer.cpu_kernels.attention as attention_module
import roformer.cpu_kernels.dropout as dropout_module
from launcher.pricing.estimate import setup_from_configs, optimizer_step_bytes
from launcher.train.device_batches import host_counts, to_device
from roformer import RoFormerConfig, RoFormerForMaskedLM
from tests.support.helpers import REPO

CONFIG = RoFormerConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)


@pytest.fixture
def cpu_kernel_calls(monkeypatch) -> list[str]:
    """Records every call of the CPU-only kernels (and still runs them)."""
    calls: list[str] = []
    attention, dropout_add = attention_module.dropout_attention, dropout_module._DropoutAdd.apply

    def spy_attention(*args, **kwargs):
        calls.append("attention dropout")
        return attention(*args, **kwargs)

    def spy_dropout(*args, **kwargs):
        calls.append("dropout")
        return dropout_add(*args, **kwargs)

    monkeypatch.setattr(attention_module, "dropout_attention", spy_attention)
    monkeypatch.setattr(dropout_module._DropoutAdd, "apply", spy_dropout)
    return calls


def train_step(device: str, padded: bool) -> torch.Tensor:
    torch.manual_seed(0)
    model = RoFormerForMaskedLM(CONFIG).train().to(device)
    input_ids = torch.randint(5, 100, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    if padded:
        mask[1, 10:] = 0
    logits = model(input_ids.to(device), attention_mask=mask.to(device)).logits
    logits.float().sum().backward()
    return logits


@pytest.mark.parametrize("padded", [False, True])
def test_cpu_only_kernels_serve_cpu_tensors_only(cpu_kernel_calls, padded):
    train_step("cpu", padded)
    assert "attention dropout" in cpu_kernel_calls and "dropout" in cpu_kernel_calls  # the spy sees them on CPU
    cpu_kernel_calls.clear()
    logits = train_step("meta", padded)  # a device that is not the CPU: SDPA and torch's own dropout
    assert logits.device.type == "meta" and cpu_kernel_calls == []


def test_batches_reach_an_accelerator_counted_on_the_host_without_a_padding_free_mask():
    labels = torch.full((2, 8), -100)
    labels[0, 3] = labels[1, 5] = 7
    full = {"input_ids": torch.ones(2, 8, dtype=torch.long), "attention_mask": torch.ones(2, 8, dtype=torch.long),
            "labels": labels}
    padded = {**full, "attention_mask": torch.tensor([[1] * 8, [1] * 5 + [0] * 3])}
    assert host_counts(full) == (2, 16) and host_counts(padded) == (2, 13)
    moved = to_device(full, "meta")
    assert set(moved) == {"input_ids", "labels"} and all(t.device.type == "meta" for t in moved.values())
    assert "attention_mask" in full  # the host batch is not changed
    moved = to_device(padded, torch.device("meta"))
    assert moved["attention_mask"].device.type == "meta" and moved["attention_mask"].shape == (2, 8)
    # On the CPU the batch is used as it is: the model drops an all-ones mask itself (roformer/model.py).
    same = to_device(full, "cpu")
    assert all(same[key] is full[key] for key in full)


def test_a_model_without_a_mask_equals_one_with_an_all_ones_mask():
    """What dropping the padding-free mask relies on."""
    torch.manual_seed(0)
    model = RoFormerForMaskedLM(CONFIG).eval()
    input_ids = torch.randint(5, 100, (2, 16))
    with torch.no_grad():
        assert torch.equal(model(input_ids).logits, model(input_ids, attention_mask=torch.ones_like(input_ids)).logits)


@pytest.mark.parametrize("name", ["v100_fp16_zero1.json", "v100_fp16_zero2.json", "v100_fp16_zero3.json",
                                  "v100_fp16_zero2_offload.json"])
def test_gpu_deepspeed_configs_get_the_fused_adam(name):
    """DeepSpeed builds FusedAdam (adam_w_mode) for type Adam/AdamW unless `torch_adam` is set, and
    DeepSpeedCPUAdam with optimizer offload: the GPU JSONs must not ask for torch's AdamW."""
    config = json.loads((REPO / "ds_configs" / name).read_text())
    assert config["optimizer"]["type"].lower() in ("adam", "adamw")
    assert not config["optimizer"].get("params", {}).get("torch_adam")
    from launcher.config.deepspeed_json import DeepSpeedJson

    setup = setup_from_configs(CONFIG, DeepSpeedJson.from_config(config), world_size=8, activation_checkpointing=False,
                               cpu_ranks=False)
    assert optimizer_step_bytes(setup) == 0  # fused kernels update in place: no step temporaries priced

"""Document attention through FlashAttention's variable-length kernel on a CUDA device (tests/unit/
test_varlen_documents.py checks its offsets, layout and shapes on the CPU): the kernel runs, and its losses and
gradients are the masked path's (the same documents, SDPA with the (B, 1, T, T) mask) to bf16 rounding.
Written on a CPU machine: not yet run on a GPU."""
from __future__ import annotations

import copy

import pytest
import torch

import torch.nn.attention.varlen as varlen_module
from launcher.train.device_batches import to_device
from roformer import RoFormerConfig, RoFormerForMaskedLM
from tests.unit.test_model_compile import NO_DROPOUT, batch

DEVICE = torch.device("cuda", 0)
CONFIG = RoFormerConfig(vocab_size=120, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, **NO_DROPOUT)


@pytest.mark.parametrize("training", [False, True])
def test_the_varlen_kernel_gives_the_masked_paths_losses_and_gradients(monkeypatch, training):
    calls = []
    kernel = varlen_module.varlen_attn
    monkeypatch.setattr(varlen_module, "varlen_attn", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    torch.manual_seed(0)
    varlen = RoFormerForMaskedLM(CONFIG).train(training).to(DEVICE, torch.bfloat16)
    masked = copy.deepcopy(varlen)
    data = to_device(batch(documents=True), DEVICE)  # with its cu_seqlens, from the host
    assert "cu_seqlens" in data
    results = []
    for model, inputs in ((varlen, data), (masked, {k: v for k, v in data.items() if k != "cu_seqlens"})):
        out = model(**inputs)
        out.loss_sum.float().backward()
        results.append((out.loss_sum.float(), [p.grad.float() for p in model.parameters()]))
    assert calls, "the varlen kernel did not run"
    (loss_v, grads_v), (loss_m, grads_m) = results
    assert torch.allclose(loss_v, loss_m, rtol=2e-2)
    for got, want in zip(grads_v, grads_m):
        assert torch.allclose(got, want, rtol=5e-2, atol=5e-2 * float(want.abs().max()))

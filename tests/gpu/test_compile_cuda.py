"""`model.compile` on a CUDA device (tests/unit/test_model_compile.py checks the same on the CPU with the CPU kernels
switched off and the aot_eager backend): the training forward + loss has no graph break on the real device, and
inductor's compiled layers give eager's losses and gradients in fp32 (TF32 off). Written on a CPU machine: not yet
run on a GPU."""
from __future__ import annotations

import copy

import torch

from roformer import RoFormerConfig, RoFormerForMaskedLM
from tests.unit.test_model_compile import NO_DROPOUT, batch

DEVICE = torch.device("cuda", 0)
CONFIG = RoFormerConfig(vocab_size=120, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                        intermediate_size=128, **NO_DROPOUT)


def test_the_training_forward_and_loss_have_no_graph_break_on_cuda():
    torch._dynamo.reset()
    model = RoFormerForMaskedLM(CONFIG).train().to(DEVICE)
    for documents in (False, True):
        data = {key: value.to(DEVICE) for key, value in batch(documents).items()}
        explained = torch._dynamo.explain(lambda **inputs: model(**inputs).loss_sum)(**data)
        assert explained.graph_break_count == 0, [reason.reason for reason in explained.break_reasons]


def test_inductor_layers_give_the_eager_losses_and_gradients_on_cuda(monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = RoFormerForMaskedLM(CONFIG).train().to(DEVICE)
    compiled = copy.deepcopy(eager)
    compiled.compile_layers(backend="inductor")
    data = {key: value.to(DEVICE) for key, value in batch().items()}
    results = []
    for model in (eager, compiled):
        model.zero_grad()
        out = model(**data)
        out.loss_sum.backward()
        results.append((out.loss_sum.item(), torch.cat([p.grad.flatten() for p in model.parameters()])))
    (loss, grads), (compiled_loss, compiled_grads) = results
    assert abs(compiled_loss - loss) <= 1e-5 * abs(loss)
    assert (compiled_grads - grads).norm() <= 1e-5 * grads.norm()  # inductor on the CPU: 4e-7 (compile_cpu.json)

"""roformer.mlm_loss: the chunked summed cross-entropy equals F.cross_entropy + argmax, with gradients."""

import pytest
import torch
import torch.nn.functional as F

from roformer import mlm_loss
from roformer.mlm_loss import summed_cross_entropy


@pytest.fixture(params=["one_chunk", "many_chunks"])
def chunking(request, monkeypatch):
    if request.param == "many_chunks":
        monkeypatch.setattr(mlm_loss, "_CHUNK_ELEMENTS", 3 * 50)  # 3 rows of 50 per chunk, last one partial
    return request.param


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_equals_cross_entropy_argmax_and_their_gradients(chunking, dtype):
    torch.manual_seed(0)
    logits = (torch.randn(11, 50) * 3).to(dtype).requires_grad_()
    targets = torch.randint(0, 50, (11,))
    targets[:4] = logits.detach()[:4].argmax(dim=-1)  # some hits
    loss_sum, correct = summed_cross_entropy(logits, targets)
    expected = F.cross_entropy(logits.float(), targets, reduction="sum")
    assert loss_sum.dtype == torch.float32 and correct.dtype == torch.long
    torch.testing.assert_close(loss_sum, expected, atol=1e-4, rtol=1e-5)
    assert correct.item() == (logits.argmax(dim=-1) == targets).sum().item() >= 4
    scale = torch.tensor(0.37)  # the trainer back-propagates a scaled loss
    (ours,) = torch.autograd.grad(loss_sum * scale, logits)
    (reference,) = torch.autograd.grad(expected * scale, logits)
    assert ours.dtype == dtype
    tolerance = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(ours, reference, atol=tolerance, rtol=tolerance)


def test_no_rows_gives_zero_that_backpropagates():
    logits = torch.randn(0, 7, requires_grad=True)
    loss_sum, correct = summed_cross_entropy(logits, torch.zeros(0, dtype=torch.long))
    assert loss_sum.item() == 0.0 and correct.item() == 0
    loss_sum.backward()
    assert logits.grad.shape == (0, 7)

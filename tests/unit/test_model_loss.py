"""roformer.cpu_kernels.mlm_loss: the CPU decoder + loss function equals F.linear + F.cross_entropy + argmax,
with the gradients of the reference ops, in one chunk and in many."""

import pytest
import torch
import torch.nn.functional as F

from roformer.cpu_kernels import decoder_cross_entropy, mlm_loss


@pytest.fixture(params=["one_chunk", "many_chunks"])
def chunking(request, monkeypatch):
    if request.param == "many_chunks":
        # 7-column vocabulary slices of the 50 logits, the last one partial
        monkeypatch.setattr(mlm_loss, "_CHUNK_ELEMENTS", 1)
        monkeypatch.setattr(mlm_loss, "_MIN_COLUMNS", 7)
    return request.param


def inputs(dtype, rows=11):
    torch.manual_seed(0)
    features = torch.randn(rows, 6, dtype=dtype, requires_grad=True)
    weight = torch.randn(50, 6, dtype=dtype, requires_grad=True)
    bias = torch.randn(50, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, 50, (rows,))
    with torch.no_grad():
        targets[:4] = F.linear(features[:4], weight, bias).argmax(dim=-1)  # some hits
    return features, weight, bias, targets


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_equals_linear_cross_entropy_argmax_and_their_gradients(chunking, dtype):
    features, weight, bias, targets = inputs(dtype)
    parts, loss_sum, correct = decoder_cross_entropy(features, weight, bias, targets)
    assert len(parts) == (8 if chunking == "many_chunks" else 1)
    logits = torch.cat(parts, dim=-1)
    expected_logits = F.linear(features, weight, bias)
    expected = F.cross_entropy(expected_logits.float(), targets, reduction="sum")
    assert loss_sum.dtype == torch.float32 and correct.dtype == torch.long and logits.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(logits, expected_logits, atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(loss_sum, expected, atol=1e-4 if dtype == torch.float32 else 0.5, rtol=1e-4)
    assert correct.item() == (expected_logits.argmax(dim=-1) == targets).sum().item() >= 4
    # the trainer back-propagates a scaled loss; a caller may also use the logits
    scale = torch.tensor(0.37)
    extra = torch.randn(logits.shape)
    ours = torch.autograd.grad(loss_sum * scale + (logits.float() * extra).sum(), (features, weight, bias))
    reference = torch.autograd.grad(expected * scale + (expected_logits.float() * extra).sum(),
                                    (features, weight, bias))
    for mine, theirs in zip(ours, reference):
        assert mine.dtype == dtype
        torch.testing.assert_close(mine, theirs, atol=10 * tolerance, rtol=tolerance)


def test_no_rows_gives_zero_that_backpropagates():
    features, weight, bias, targets = inputs(torch.float32, rows=0)
    parts, loss_sum, correct = decoder_cross_entropy(features, weight, bias, targets)
    assert torch.cat(parts, dim=-1).shape == (0, 50) and loss_sum.item() == 0.0 and correct.item() == 0
    loss_sum.backward()
    assert weight.grad.abs().sum() == 0 and bias.grad.abs().sum() == 0


def test_logits_alone_backpropagate_as_a_linear_layer(chunking):
    features, weight, bias, targets = inputs(torch.float32)
    parts, _, _ = decoder_cross_entropy(features, weight, bias, targets)
    logits = torch.cat(parts, dim=-1)
    extra = torch.randn(logits.shape)
    ours = torch.autograd.grad((logits * extra).sum(), (features, weight, bias))
    reference = torch.autograd.grad((F.linear(features, weight, bias) * extra).sum(), (features, weight, bias))
    for mine, theirs in zip(ours, reference):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)


def test_ties_count_the_first_maximum_as_argmax_does(chunking):
    """A row whose maximum appears in two slices is a hit only for the first column, as with argmax."""
    features = torch.ones(2, 6)
    weight = torch.zeros(50, 6)
    weight[[3, 45]] = 1.0  # columns 3 and 45 tie for the maximum (different slices when chunked)
    targets = torch.tensor([3, 45])
    _, _, correct = decoder_cross_entropy(features, weight, torch.zeros(50), targets)
    assert correct.item() == 1

"""CPU dropout kernels (roformer.cpu_kernels.dropout, roformer.cpu_kernels.attention): the statistics of F.dropout, the
gradients of the reference ops, reproducibility from torch's RNG, and which device takes which path."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from roformer import RoFormerConfig, RoFormerForMaskedLM
from roformer.attention import additive_padding_mask, document_mask
from roformer.cpu_kernels import attention as cpu_attention
from roformer.cpu_kernels import dropout_add, use_cpu_kernels
from roformer.cpu_kernels.attention import document_spans, dropout_attention
from roformer.cpu_kernels.dropout import keep_mask, new_bit_stream


def within_sigmas(observed: float, p: float, n: int, sigmas: float = 5.0) -> bool:
    return abs(observed - p) <= sigmas * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_mask_drops_each_element_independently_with_probability_p(p):
    torch.manual_seed(0)
    dropped = ~keep_mask((256, 4096), p, new_bit_stream())
    n = dropped.numel()
    assert within_sigmas(dropped.float().mean().item(), p, n)
    # independence: neighbours along rows and columns and two elements 31 apart are jointly
    # dropped with probability p^2 (a word split across elements or a reused stream would show here)
    flat = dropped.view(-1)  # and far apart in the stream
    for a, b in [(dropped[:, :-1], dropped[:, 1:]), (dropped[:-1], dropped[1:]),
                 (dropped[:, :-31], dropped[:, 31:]), (flat[:n // 2], flat[n // 2:])]:
        assert within_sigmas((a & b).float().mean().item(), p * p, a.numel())
    # no position is special: per-column drop counts are binomial (chi-square of 4096 columns)
    counts = dropped.sum(dim=0).double()
    expected, variance = 256 * p, 256 * p * (1 - p)
    chi_square = (((counts - expected) ** 2) / variance).sum().item()
    assert abs(chi_square - 4096) < 5 * math.sqrt(2 * 4096)


@pytest.mark.parametrize("size", [1000, 1 << 20])
def test_keep_mask_of_zero_keeps_everything_and_masks_follow_torch_seed(size):
    torch.manual_seed(1)
    assert keep_mask((size,), 0.0, new_bit_stream()).all()
    torch.manual_seed(3)
    first = keep_mask((size,), 0.3, new_bit_stream())
    torch.manual_seed(3)
    again = keep_mask((size,), 0.3, new_bit_stream())
    other = keep_mask((size,), 0.3, new_bit_stream())  # the stream's seed advanced torch's generator
    assert torch.equal(first, again) and not torch.equal(first, other)


def test_dropout_add_is_f_dropout_in_distribution_and_gradient():
    torch.manual_seed(0)
    p = 0.2
    residual = torch.randn(64, 1024, requires_grad=True)
    x = torch.randn(64, 1024, requires_grad=True)
    out = dropout_add(residual, x, p, training=True)
    branch = (out - residual).detach()
    kept = branch != 0
    assert within_sigmas(1 - kept.float().mean().item(), p, x.numel())
    torch.testing.assert_close(branch[kept], x.detach()[kept] / (1 - p))  # survivors scaled 1/(1-p)
    grad = torch.randn_like(x)
    out.backward(grad)
    torch.testing.assert_close(residual.grad, grad)
    torch.testing.assert_close(x.grad, grad * kept / (1 - p))
    # without residual it is plain dropout; outside training, or at p = 0, nothing is dropped
    torch.manual_seed(5)
    alone = dropout_add(None, x.detach(), p, training=True)
    assert within_sigmas((alone == 0).float().mean().item(), p, x.numel())
    assert torch.equal(dropout_add(residual, x, p, training=False), residual + x)
    assert torch.equal(dropout_add(None, x, 0.0, training=True), x)


def reference_attention(query, key, value, bias, keep, p):
    """Dropout attention spelled out with autograd ops and a given keep mask (B, H, T, Tk)."""
    scores = query @ key.transpose(-1, -2) / math.sqrt(query.shape[-1])
    if bias is not None:
        scores = scores + bias
    return (scores.softmax(dim=-1) * keep / (1 - p)) @ value


@pytest.fixture(params=["whole_heads", "split_rows"])
def block_size(request, monkeypatch):
    """Blocks of whole heads (the benchmark shape; documents: one block per document) and blocks of part of one
    head's rows (long sequences; documents: a document's block is too large, the bias blocks run)."""
    if request.param == "split_rows":
        monkeypatch.setattr(cpu_attention, "_BLOCK_ELEMENTS", 3 * 16)  # 3 query rows of 16 keys per block
    return request.param


def attention_inputs(with_padding: bool, dtype=torch.float32):
    torch.manual_seed(0)
    batch, heads, length, head_size = 2, 3, 16, 16
    q, k = (torch.randn(batch, heads, length, head_size, dtype=dtype, requires_grad=True) for _ in range(2))
    # identity values: each output row is the row's dropped probabilities, so the mask is visible
    v = torch.eye(length, dtype=dtype).expand(batch, heads, length, length).clone().requires_grad_()
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1, -5:] = 0
    bias = additive_padding_mask(mask, dtype) if with_padding else None
    if with_padding == "documents":  # three documents per row, no padding: a (B, 1, T, T) bias, run per document
        document_ids = torch.tensor([[0] * 3 + [1] * 4 + [2] * 3 + [3] * 6, [0] * 5 + [1] * 2 + [2] * 4 + [3] * 5])
        bias = additive_padding_mask(document_mask(document_ids, None), dtype)
        spans = document_spans(bias)  # 140 of the 512 dense scores: under _DOCUMENT_SHARE, run per document
        assert spans == [(0, 0, 3), (0, 3, 7), (0, 7, 10), (0, 10, 16), (1, 0, 5), (1, 5, 7), (1, 7, 11), (1, 11, 16)]
    return q, k, v, bias


@pytest.mark.parametrize("with_padding", [False, True, "documents"])
def test_dropout_attention_without_dropout_equals_sdpa_forward_and_gradients(block_size, with_padding):
    q, k, v, bias = attention_inputs(with_padding)
    grad = torch.randn(2, 3, 16, 16)
    ours = dropout_attention(q, k, v, bias, 0.0)
    ours_grads = torch.autograd.grad(ours, (q, k, v), grad)
    with sdpa_kernel(SDPBackend.MATH):
        reference = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    reference_grads = torch.autograd.grad(reference, (q, k, v), grad)
    torch.testing.assert_close(ours, reference, atol=1e-6, rtol=1e-5)
    for mine, theirs in zip(ours_grads, reference_grads):
        torch.testing.assert_close(mine, theirs, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("with_padding", [False, True, "documents"])
def test_dropout_attention_drops_probabilities_after_the_softmax(block_size, with_padding):
    p = 0.25
    q, k, v, bias = attention_inputs(with_padding)
    torch.manual_seed(7)
    out = dropout_attention(q, k, v, bias, p)  # with identity values: softmax(scores) * keep / (1 - p)
    with torch.no_grad():
        probs = reference_attention(q, k, v, bias, torch.ones(()), 0.0)
    keep = out.detach() != 0
    real = probs > 0  # padded keys have probability 0 whether dropped or not
    assert within_sigmas(1 - keep[real].float().mean().item(), p, int(real.sum()), sigmas=4)
    # kept probabilities are the full softmax's (normalised over all keys), scaled by 1 / (1 - p)
    torch.testing.assert_close(out.detach()[keep], probs[keep] / (1 - p), atol=1e-6, rtol=1e-5)
    # gradients are those of the reference ops under the same mask
    grad = torch.randn_like(out)
    ours = torch.autograd.grad(out, (q, k, v), grad)
    reference = torch.autograd.grad(reference_attention(q, k, v, bias, keep, p), (q, k, v), grad)
    for mine, theirs in zip(ours, reference):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-4)


def test_dropout_attention_mask_statistics_at_a_realistic_size():
    torch.manual_seed(0)
    p, length = 0.1, 256
    q = torch.zeros(2, 4, length, 8, requires_grad=True)  # uniform probabilities 1 / length
    k = torch.zeros(2, 4, length, 8)
    v = torch.eye(length).expand(2, 4, length, length)
    out = dropout_attention(q, k, v, None, p)
    dropped = out == 0
    assert within_sigmas(dropped.float().mean().item(), p, out.numel())
    torch.testing.assert_close(out[~dropped], torch.full_like(out[~dropped], 1 / length / (1 - p)))
    # rows drop independently: the number dropped per row is binomial(length, p)
    per_row = dropped.sum(dim=-1).double()
    assert abs(per_row.var().item() - length * p * (1 - p)) < 0.2 * length * p * (1 - p)


def test_half_precision_inputs_compute_in_float32_and_return_their_dtype():
    q, k, v, bias = attention_inputs(with_padding=True, dtype=torch.bfloat16)
    out = dropout_attention(q, k, v, bias, 0.0)
    assert out.dtype == torch.bfloat16
    reference = reference_attention(q.float(), k.float(), v.float(), bias.float(), torch.ones(()), 0.0)
    torch.testing.assert_close(out.float(), reference, atol=1e-2, rtol=1e-2)
    out.sum().backward()
    assert q.grad.dtype == k.grad.dtype == v.grad.dtype == torch.bfloat16


def model_and_batch(**overrides):
    torch.manual_seed(0)
    config = RoFormerConfig(vocab_size=101, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=64, **overrides)
    input_ids = torch.randint(5, 101, (2, 24))
    mask = torch.ones_like(input_ids)
    mask[1, -4:] = 0
    return RoFormerForMaskedLM(config), input_ids, mask


def test_model_dropout_is_on_in_training_only_and_follows_the_seed():
    model, input_ids, mask = model_and_batch()
    model.eval()
    with torch.no_grad():
        eval_out = model(input_ids, mask).logits
        model.train()
        torch.manual_seed(11)
        first = model(input_ids, mask).logits
        torch.manual_seed(11)
        again = model(input_ids, mask).logits
        different = model(input_ids, mask).logits
    assert torch.equal(first, again) and not torch.allclose(first, different)
    assert not torch.allclose(first, eval_out)
    without_dropout, _, _ = model_and_batch(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    without_dropout.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(without_dropout.train()(input_ids, mask).logits, eval_out)


def test_activation_checkpointing_recomputes_the_same_masks():
    """checkpoint() restores torch's RNG state before recomputing; the masks are seeded from it."""
    grads = []
    for checkpointing in (False, True):
        model, input_ids, mask = model_and_batch()
        model.train().enable_gradient_checkpointing(checkpointing)
        torch.manual_seed(4)
        model(input_ids, mask).logits.square().sum().backward()
        grads.append([p.grad for p in model.parameters()])
    for plain, recomputed in zip(*grads):
        torch.testing.assert_close(recomputed, plain, atol=1e-6, rtol=1e-5)


def test_only_cpu_tensors_take_the_cpu_kernels(monkeypatch):
    """Other devices keep SDPA / F.dropout, whose GPU kernels support dropout natively (checked on
    the meta device, which runs the generic path's shape logic without a GPU)."""
    assert use_cpu_kernels(torch.empty(1)) and not use_cpu_kernels(torch.empty(1, device="meta"))
    calls = []
    monkeypatch.setattr("roformer.cpu_kernels.attention.dropout_attention", lambda *args: calls.append(args))
    model, input_ids, mask = model_and_batch()
    model.to("meta").train()
    out = model(input_ids.to("meta"), mask.to("meta")).logits
    assert out.device.type == "meta" and out.shape == (2, 24, 101) and not calls


def test_document_spans_give_each_padding_query_a_span_of_its_own():
    """A padding query sees no key under a document mask: the per-document kernel lets it attend to itself."""
    document_ids = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0, 0]])
    bias = additive_padding_mask(document_mask(document_ids, mask), torch.float32)
    assert document_spans(bias) == [(0, 0, 3), (0, 3, 5), (0, 5, 6), (0, 6, 7), (0, 7, 8)]


def test_a_document_bias_runs_per_document_only_where_that_saves_work(monkeypatch):
    calls = []
    per_document = cpu_attention._DocumentDropoutAttention.apply
    monkeypatch.setattr(cpu_attention._DocumentDropoutAttention, "apply",
                        lambda *args: calls.append(args[3]) or per_document(*args))
    q, k, v, bias = attention_inputs("documents")
    dropout_attention(q, k, v, bias, 0.1)
    assert calls == [document_spans(bias)]
    monkeypatch.setattr(cpu_attention, "_DOCUMENT_SHARE", 0.25)  # 140 / 512 dense scores is more: bias blocks
    dropout_attention(q, k, v, bias, 0.1)
    assert len(calls) == 1

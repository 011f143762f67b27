"""Our model on its own: masked-only MLM logits, padding, position variants, heads, import hygiene."""

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from roformer import (
    IGNORE_INDEX,
    ConfigError,
    RoFormerConfig,
    RoFormerForMaskedLM,
    RoFormerForSequenceClassification,
)

TINY = dict(vocab_size=211, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def tiny_model(**overrides) -> RoFormerForMaskedLM:
    torch.manual_seed(0)
    return RoFormerForMaskedLM(RoFormerConfig(**{**TINY, **overrides})).eval()


def batch(length=12, batch_size=3, seed=1):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, TINY["vocab_size"], (batch_size, length), generator=generator)
    attention_mask = torch.ones(batch_size, length, dtype=torch.long)
    attention_mask[1, length - 3:] = 0
    input_ids[attention_mask == 0] = 0
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    picks = (torch.rand(batch_size, length, generator=generator) < 0.3) & (attention_mask == 1)
    labels[picks] = input_ids[picks]
    return input_ids, attention_mask, labels


def test_masked_only_logits_equal_full_logits_and_loss_fields():
    model = tiny_model()
    input_ids, attention_mask, labels = batch()
    with torch.no_grad():
        full = model(input_ids, attention_mask).logits  # (B, T, V)
        masked = model(input_ids, attention_mask, labels=labels)
    is_masked = labels != IGNORE_INDEX
    assert masked.logits.shape == (int(is_masked.sum()), TINY["vocab_size"])
    torch.testing.assert_close(masked.logits, full[is_masked], atol=1e-6, rtol=1e-6)
    assert masked.num_masked.dtype == torch.long and masked.num_masked.item() == int(is_masked.sum())
    expected_sum = F.cross_entropy(full[is_masked], labels[is_masked], reduction="sum")
    torch.testing.assert_close(masked.loss_sum, expected_sum, atol=1e-5, rtol=1e-6)
    assert masked.loss_sum.dtype == torch.float32
    expected_correct = (full[is_masked].argmax(-1) == labels[is_masked]).sum()
    assert masked.num_correct.dtype == torch.long and masked.num_correct.item() == expected_correct.item()
    torch.testing.assert_close(masked.loss, expected_sum / is_masked.sum())


def test_no_masked_tokens_gives_zero_loss_that_still_backpropagates():
    model = tiny_model().train()
    input_ids, attention_mask, _ = batch()
    out = model(input_ids, attention_mask, labels=torch.full_like(input_ids, IGNORE_INDEX))
    assert out.num_masked.item() == 0 and out.loss_sum.item() == 0.0 and out.loss.item() == 0.0
    out.loss_sum.backward()  # must not raise: a rank may draw a batch without masks


def test_decoder_is_tied_to_word_embeddings():
    model = tiny_model().train()
    input_ids, attention_mask, labels = batch()
    word = model.roformer.embeddings.word.weight
    assert sum(p is word for p in model.parameters()) == 1
    model(input_ids, attention_mask, labels=labels).loss_sum.backward()
    # rows of predicted-but-absent tokens only get gradient through the tied decoder
    absent = sorted(set(range(5, TINY["vocab_size"])) - set(input_ids.flatten().tolist()))[0]
    assert word.grad[absent].abs().sum() > 0


@pytest.mark.parametrize("attention", ["softmax", "linear"])
def test_padding_does_not_change_real_tokens(attention):
    model = tiny_model(attention=attention)
    input_ids, attention_mask, _ = batch(length=10, batch_size=2)
    attention_mask[:] = 1
    padded_ids = torch.cat([input_ids, torch.randint(5, 200, (2, 6))], dim=1)  # junk behind a 0 mask
    padded_mask = torch.cat([attention_mask, torch.zeros(2, 6, dtype=torch.long)], dim=1)
    with torch.no_grad():
        short = model(input_ids, attention_mask).logits
        long = model(padded_ids, padded_mask).logits[:, :10]
    torch.testing.assert_close(long, short, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("overrides", [
    dict(position_encoding="learned", max_position_embeddings=16),
    dict(position_encoding="sinusoidal", max_position_embeddings=16),
    dict(attention="linear"),
    dict(attention="linear", rotary_value=True),
    dict(rope_scaling="linear", rope_scaling_factor=2.0),
    dict(rope_scaling="ntk", rope_scaling_factor=4.0),
    dict(embedding_size=16, hidden_act="gelu_new"),
])
def test_variants_train(overrides):
    model = tiny_model(**overrides).train()
    input_ids, attention_mask, labels = batch()
    out = model(input_ids, attention_mask, labels=labels)
    assert torch.isfinite(out.loss_sum)
    out.loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("encoding", ["learned", "sinusoidal"])
def test_absolute_position_models_reject_longer_sequences(encoding):
    model = tiny_model(position_encoding=encoding, max_position_embeddings=16)
    input_ids, attention_mask, _ = batch(length=17)
    with pytest.raises(ConfigError, match=r"max_position_embeddings: sequence length 17 exceeds the 16"):
        model(input_ids, attention_mask)


def test_absolute_positions_change_the_output():
    model = tiny_model(position_encoding="learned", max_position_embeddings=16)
    ids = torch.tensor([[7, 7, 7, 7]])
    with torch.no_grad():
        logits = model(ids).logits[0]
    assert (logits[0] - logits[3]).abs().max() > 1e-4  # same token, different positions


def test_rope_model_has_no_maximum_length():
    model = tiny_model()
    with torch.no_grad():
        short = model(batch(length=8)[0]).logits
        long_ids = torch.randint(5, 200, (1, 1100))
        long = model(long_ids).logits
    assert long.shape == (1, 1100, TINY["vocab_size"]) and torch.isfinite(long).all()
    assert model.roformer.rope.cached_length >= 1100
    with torch.no_grad():  # growing the cache did not change short sequences
        torch.testing.assert_close(model(batch(length=8)[0]).logits, short)


def test_gradient_checkpointing_gives_the_same_gradients():
    input_ids, attention_mask, labels = batch()
    grads = []
    for enabled in (False, True):
        model = tiny_model(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).train()
        model.enable_gradient_checkpointing(enabled)
        model(input_ids, attention_mask, labels=labels).loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(grads[0], grads[1])


def test_init_like_transformers():
    model = RoFormerForMaskedLM(RoFormerConfig(**{**TINY, "vocab_size": 1000, "initializer_range": 0.05}))
    word = model.roformer.embeddings.word.weight
    assert torch.all(word[0] == 0)  # [PAD] row
    assert abs(word[1:].std().item() - 0.05) < 0.005
    layer = model.roformer.layers[0]
    assert torch.all(layer.attention.query.bias == 0) and torch.all(layer.ffn_norm.weight == 1)
    assert torch.all(model.mlm_head.bias == 0)


def test_sequence_classification():
    torch.manual_seed(0)
    model = RoFormerForSequenceClassification(RoFormerConfig(**TINY), num_labels=3).eval()
    input_ids, attention_mask, _ = batch()
    labels = torch.tensor([0, 2, 1])
    out = model(input_ids, attention_mask, labels=labels)
    assert out.logits.shape == (3, 3)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, labels))
    regression = RoFormerForSequenceClassification(RoFormerConfig(**TINY), num_labels=1)
    out = regression(input_ids, attention_mask, labels=torch.tensor([0.5, 1.0, -1.0]))
    assert out.logits.shape == (3, 1) and out.loss.ndim == 0
    with pytest.raises(ConfigError, match="num_labels"):
        RoFormerForSequenceClassification(RoFormerConfig(**TINY), num_labels=0)


def test_importing_roformer_does_not_import_deepspeed():
    code = ("import sys, roformer; bad = [m for m in ('deepspeed', 'torch.distributed.run') if m in sys.modules];"
            "assert not bad, bad")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("overrides", [dict(), dict(attention="linear"),
                                       dict(position_encoding="sinusoidal", max_position_embeddings=16)])
def test_bf16_model_runs_and_reports_fp32_loss(overrides):
    """What a DeepSpeed bf16 engine does: cast the whole module, feed the same integer batch."""
    model = tiny_model(**overrides).to(torch.bfloat16).train()
    input_ids, attention_mask, labels = batch()
    out = model(input_ids, attention_mask, labels=labels)
    assert out.logits.dtype == torch.bfloat16 and out.loss_sum.dtype == torch.float32
    assert torch.isfinite(out.loss_sum)
    out.loss.backward()
    reference = tiny_model(**overrides).eval()
    with torch.no_grad():
        expected = reference(input_ids, attention_mask, labels=labels).loss
        got = model.eval()(input_ids, attention_mask, labels=labels).loss
    assert abs(got.item() - expected.item()) < 0.05 * expected.item()


def test_feed_forward_in_token_chunks_equals_one_pass(monkeypatch):
    """On CPU the feed-forward runs in token chunks when its intermediate would be large; same
    outputs and gradients as one pass (here forced with a 5-row chunk on a 3 x 12 batch)."""
    from roformer.cpu_kernels import ffn
    input_ids, attention_mask, labels = batch()
    results = []
    for chunk_bytes in (1 << 30, 5 * TINY["intermediate_size"] * 4):
        monkeypatch.setattr(ffn, "_FFN_CHUNK_BYTES", chunk_bytes)
        model = tiny_model(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).train()
        out = model(input_ids, attention_mask, labels=labels)
        out.loss_sum.backward()
        results.append((out.logits.detach(), [p.grad for p in model.parameters()]))
    (one_pass, one_pass_grads), (chunked, chunked_grads) = results
    torch.testing.assert_close(chunked, one_pass, atol=1e-6, rtol=1e-5)
    for got, expected in zip(chunked_grads, one_pass_grads):
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)

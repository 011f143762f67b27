"""roformer.flops: the FLOP formula against a hand computation and against torch's own FLOP counter
running the real model; parameter counts against the built models."""

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from roformer import (
    IGNORE_INDEX,
    RoFormerConfig,
    RoFormerForMaskedLM,
    RoFormerForSequenceClassification,
)
from roformer.flops import (
    forward_flops,
    hardware_training_flops,
    parameter_count,
    training_flops,
)

SMALL = dict(vocab_size=100, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=16)


def test_hand_computation_for_a_small_config():
    config = RoFormerConfig(**SMALL)
    batch, length, masked = 2, 4, 3  # N = 8 tokens, D = 4
    counts = forward_flops(config, batch, length, masked)
    # per layer: q,k,v,out 4 * (2*8*8*8) = 4096; ffn 2 * (2*8*8*16) = 4096; attention QK^T and PV:
    # 2 * (2 * B*H * T*T * D) = 2 * (2*4*16*4) = 1024. Two layers.
    assert counts.projections == 2 * 4096
    assert counts.feed_forward == 2 * 4096
    assert counts.attention == 2 * 1024
    assert counts.embedding_projection == 0
    # head at the 3 masked tokens: dense 2*3*8*8 = 384, decoder 2*3*8*100 = 4800
    assert counts.mlm_head == 384 + 4800
    assert counts.total == 8192 + 8192 + 2048 + 5184
    assert training_flops(config, batch, length, masked) == 3 * counts.total
    # checkpointing recomputes the encoder (everything but the head) once more
    assert hardware_training_flops(config, batch, length, masked, activation_checkpointing=True) == \
        3 * counts.total + (8192 + 8192 + 2048)
    assert hardware_training_flops(config, batch, length, masked, activation_checkpointing=False) == \
        3 * counts.total


def test_factorized_embeddings_and_linear_attention_terms():
    factorized = forward_flops(RoFormerConfig(**{**SMALL, "embedding_size": 4}), 2, 4, 3)
    assert factorized.embedding_projection == 2 * 8 * 4 * 8  # 2 N E h
    assert factorized.mlm_head == 2 * 3 * 8 * 4 + 2 * 3 * 4 * 100  # dense H->E, decoder E->V
    linear = forward_flops(RoFormerConfig(**{**SMALL, "attention": "linear"}), 2, 4, 3)
    assert linear.attention == 2 * (4 * 8 * 8 * 4 + 2 * 8 * 8)  # L * (4 N h D + 2 N h)


@pytest.mark.parametrize("overrides", [{}, {"embedding_size": 16}, {"attention": "linear"},
                                       {"position_encoding": "learned", "max_position_embeddings": 16}])
def test_formula_equals_torch_flop_counter_on_the_real_model(overrides):
    """FlopCounterMode counts every matmul the model runs (SDPA's math path spells attention out
    as matmuls); forward must match exactly and backward must be twice the forward."""
    config = RoFormerConfig(**{**SMALL, "hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 64,
                               **overrides})
    torch.manual_seed(0)
    model = RoFormerForMaskedLM(config).eval()
    input_ids = torch.randint(5, config.vocab_size, (3, 12))
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    labels[0, :5], labels[2, 7:] = input_ids[0, :5], input_ids[2, 7:]  # 10 masked tokens
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as forward_counter:
        out = model(input_ids, torch.ones_like(input_ids), labels=labels)
    with FlopCounterMode(display=False) as backward_counter:
        out.loss_sum.backward()
    expected = forward_flops(config, 3, 12, 10)
    assert forward_counter.get_total_flops() == expected.total
    assert backward_counter.get_total_flops() == 2 * expected.total
    assert forward_counter.get_total_flops() + backward_counter.get_total_flops() == \
        training_flops(config, 3, 12, 10)


def test_bad_shapes_are_refused_by_name():
    config = RoFormerConfig(**SMALL)
    with pytest.raises(ValueError, match="num_masked"):
        forward_flops(config, 2, 4, 9)
    with pytest.raises(ValueError, match="batch_size and seq_len"):
        forward_flops(config, 0, 4, 0)
    with pytest.raises(ValueError, match="head"):
        parameter_count(config, head="token")


@pytest.mark.parametrize("overrides", [{}, {"embedding_size": 4}, {"type_vocab_size": 3},
                                       {"position_encoding": "learned", "max_position_embeddings": 16},
                                       {"position_encoding": "sinusoidal", "max_position_embeddings": 16}])
def test_parameter_count_equals_the_built_models(overrides):
    config = RoFormerConfig(**{**SMALL, **overrides})
    mlm = RoFormerForMaskedLM(config)
    assert parameter_count(config) == sum(p.numel() for p in mlm.parameters())
    classifier = RoFormerForSequenceClassification(config, num_labels=5)
    assert parameter_count(config, head="classification", num_labels=5) == \
        sum(p.numel() for p in classifier.parameters())

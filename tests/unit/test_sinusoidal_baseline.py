"""The sinusoidal baseline as Vaswani et al. use it: token embeddings x sqrt(d_model) + the fixed table.

The earlier baseline (now 'sinusoidal_unscaled') added the table (RMS 1/sqrt(2)) to word embeddings
of std 0.02, so at init the position signal was ~35x the token signal; these tests pin the scale of
each variant against the table's RMS.
"""
from __future__ import annotations

import math

import torch

from roformer import RoFormerConfig, RoFormerForMaskedLM
from roformer.model import Embeddings, sinusoidal_position_table


def _config(encoding: str, size: int = 128) -> RoFormerConfig:
    return RoFormerConfig(vocab_size=500, hidden_size=size, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=64, position_encoding=encoding, max_position_embeddings=256,
                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _embeddings(config: RoFormerConfig) -> Embeddings:
    """Initialised as in training (normal, std initializer_range = 0.02)."""
    return RoFormerForMaskedLM(config).roformer.embeddings


def _rms(x: torch.Tensor) -> float:
    return float(x.detach().double().pow(2).mean().sqrt())


def _summed_inputs(embeddings: Embeddings, ids: torch.Tensor) -> torch.Tensor:
    """What the LayerNorm sees: capture its input."""
    seen = {}
    handle = embeddings.norm.register_forward_hook(lambda module, args, out: seen.setdefault("x", args[0]))
    embeddings(ids, None)
    handle.remove()
    return seen["x"]


def _at_init(encoding: str):
    """(config, embeddings, ids, LayerNorm input, table rows) for 4 x 64 random ids under seed 0."""
    torch.manual_seed(0)
    config = _config(encoding)
    embeddings = _embeddings(config)
    ids = torch.randint(5, config.vocab_size, (4, 64))
    return config, embeddings, ids, _summed_inputs(embeddings, ids), embeddings.position_table[:64]


def test_the_table_has_rms_one_over_sqrt_two():
    assert abs(_rms(sinusoidal_position_table(512, 128)) - 1 / math.sqrt(2)) < 1e-3


def test_vaswani_scaling_multiplies_token_embeddings_by_sqrt_d_model():
    config, embeddings, ids, summed, table = _at_init("sinusoidal")
    tokens = summed - table - embeddings.token_type.weight[0]
    expected = embeddings.word(ids) * math.sqrt(config.embedding_size)
    torch.testing.assert_close(tokens, expected, rtol=1e-5, atol=1e-5)
    # std 0.02 x sqrt(128) = 0.226: the token signal is now a third of the table's (0.707), not 1/35.
    ratio = _rms(expected) / _rms(table)
    assert 0.25 < ratio < 0.4, ratio


def test_unscaled_variant_keeps_the_old_sum_and_its_mismatch():
    _, embeddings, ids, summed, table = _at_init("sinusoidal_unscaled")
    torch.testing.assert_close(summed, embeddings.word(ids) + embeddings.token_type.weight[0] + table)
    assert _rms(embeddings.word(ids)) / _rms(table) < 0.05  # position drowns the tokens at init


def test_the_two_variants_differ_only_in_the_token_scale():
    torch.manual_seed(0)
    scaled = _embeddings(_config("sinusoidal"))
    unscaled = _embeddings(_config("sinusoidal_unscaled"))
    unscaled.load_state_dict(scaled.state_dict())
    with torch.no_grad():
        unscaled.word.weight.mul_(math.sqrt(128))
    ids = torch.randint(5, 500, (2, 32))
    torch.testing.assert_close(scaled(ids, None), unscaled(ids, None), rtol=1e-5, atol=1e-5)

"""RoFormerConfig: validation errors name the field; dict round trip; architecture diff."""

from pathlib import Path

import pytest
import yaml

from roformer import ConfigError, RoFormerConfig

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("overrides, field", [
    ({"vocab_size": 0}, "vocab_size"),
    ({"hidden_size": "256"}, "hidden_size"),
    ({"num_hidden_layers": True}, "num_hidden_layers"),
    ({"hidden_size": 100, "num_attention_heads": 3}, "num_attention_heads"),
    ({"hidden_size": 36, "num_attention_heads": 4}, "num_attention_heads"),  # odd head size 9: no RoPE pairs
    ({"intermediate_size": -1}, "intermediate_size"),
    ({"embedding_size": 0}, "embedding_size"),
    ({"hidden_act": "tanh"}, "hidden_act"),
    ({"hidden_dropout_prob": 1.0}, "hidden_dropout_prob"),
    ({"attention_probs_dropout_prob": -0.1}, "attention_probs_dropout_prob"),
    ({"layer_norm_eps": 0}, "layer_norm_eps"),
    ({"pad_token_id": 8000}, "pad_token_id"),
    ({"initializer_range": "0.02"}, "initializer_range"),
    ({"rotary_value": "yes"}, "rotary_value"),
    ({"rope_theta": -1}, "rope_theta"),
    ({"rope_scaling": "yarn"}, "rope_scaling"),
    ({"rope_scaling": "none", "rope_scaling_factor": 2.0}, "rope_scaling_factor"),
    ({"rope_scaling": "linear", "rope_scaling_factor": 0.5}, "rope_scaling_factor"),
    ({"position_encoding": "alibi"}, "position_encoding"),
    ({"position_encoding": "learned"}, "max_position_embeddings"),
    ({"position_encoding": "sinusoidal", "max_position_embeddings": 0}, "max_position_embeddings"),
    ({"max_position_embeddings": 512}, "max_position_embeddings"),  # RoPE has no maximum length
    ({"position_encoding": "learned", "max_position_embeddings": 64, "rotary_value": True}, "rotary_value"),
    ({"attention": "flash"}, "attention"),
])
def test_bad_values_raise_config_error_naming_the_field(overrides, field):
    with pytest.raises(ConfigError, match=rf"^{field}:"):
        RoFormerConfig(**overrides)


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


def test_embedding_size_defaults_to_hidden_size():
    assert RoFormerConfig(hidden_size=64, num_attention_heads=2).embedding_size == 64
    assert RoFormerConfig(hidden_size=64, num_attention_heads=2, embedding_size=16).embedding_size == 16


def test_dict_round_trip_and_unknown_keys():
    config = RoFormerConfig(hidden_size=64, num_attention_heads=2, rope_scaling="ntk", rope_scaling_factor=2.0)
    assert RoFormerConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ConfigError, match=r"run\.yaml: model: unknown model config field\(s\): hiden_size, zz"):
        RoFormerConfig.from_dict({"hiden_size": 64, "zz": 1}, source="run.yaml: model")
    with pytest.raises(ConfigError, match=r"run\.yaml: model: hidden_act:"):
        RoFormerConfig.from_dict({"hidden_act": "nope"}, source="run.yaml: model")
    with pytest.raises(ConfigError, match="mapping"):
        RoFormerConfig.from_dict([1, 2])


def test_diff_names_architecture_fields_only():
    base = RoFormerConfig()
    other = RoFormerConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, initializer_range=0.1)
    assert base.diff(other) == []
    changed = RoFormerConfig(num_hidden_layers=2, vocab_size=9000, attention="linear")
    assert sorted(base.diff(changed)) == ["attention", "num_hidden_layers", "vocab_size"]
    assert base.diff(RoFormerConfig(embedding_size=256)) == []  # None resolves to hidden_size


def _shipped_model_sections():
    for path in sorted((REPO / "configs").glob("*.yaml")):
        section = (yaml.safe_load(path.read_text()) or {}).get("model")
        if section is not None:
            yield pytest.param(path, section, id=path.name)


@pytest.mark.parametrize("path, section", list(_shipped_model_sections()))
def test_every_shipped_run_config_model_section_loads(path, section):
    config = RoFormerConfig.from_dict(section, source=f"{path}: model")
    assert config.vocab_size > 0

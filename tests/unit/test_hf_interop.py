"""Interop with the real transformers RoFormer: logits parity, both round trips, exports that must refuse."""

import json

import pytest
import safetensors.torch
import torch
import transformers

import roformer.hf_interop as hf_interop
from roformer import (
    IGNORE_INDEX,
    ConfigError,
    RoFormerConfig,
    RoFormerForMaskedLM,
    RoFormerForSequenceClassification,
    config_from_hf,
    config_to_hf,
    from_hf_state_dict,
    load_classifier_from_pretrained,
    load_pretrained,
    save_pretrained,
    to_hf_state_dict,
)

TINY = dict(vocab_size=301, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def inputs(seed=0, batch_size=3, length=19):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, TINY["vocab_size"], (batch_size, length), generator=generator)
    attention_mask = torch.ones(batch_size, length, dtype=torch.long)
    attention_mask[1, 12:] = 0
    attention_mask[2, 4:] = 0
    token_type_ids = torch.randint(0, 2, (batch_size, length), generator=generator)
    return input_ids, attention_mask, token_type_ids


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Non-trivial weights everywhere (default init leaves biases 0 and LayerNorms 1)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if not parameter.requires_grad:  # transformers' frozen RoPE table stays as transformers built it
                continue
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2 + (parameter == 1) * 1.0)


def load_hf(directory, cls=transformers.RoFormerForMaskedLM, **kwargs):
    model, info = cls.from_pretrained(directory, output_loading_info=True, **kwargs)
    return model.eval(), info


@pytest.mark.parametrize("overrides", [
    dict(rotary_value=False), dict(rotary_value=True), dict(embedding_size=16), dict(hidden_act="relu"),
], ids=["plain", "rotary_value", "factorized_embeddings", "relu"])
def test_logits_match_transformers_and_export_loads_cleanly(tmp_path, overrides):
    config = RoFormerConfig(**{**TINY, **overrides})
    ours = RoFormerForMaskedLM(config).eval()
    randomize(ours, seed=1)
    save_pretrained(ours, tmp_path / "export")
    theirs, info = load_hf(tmp_path / "export")
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set()
    assert info["mismatched_keys"] == set() and not info["error_msgs"]
    input_ids, attention_mask, token_type_ids = inputs()
    with torch.no_grad():
        our_logits = ours(input_ids, attention_mask, token_type_ids).logits
        their_logits = theirs(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).logits
    assert (our_logits - their_logits).abs().max().item() <= 1e-5
    assert our_logits.abs().max() > 0.1  # the comparison is not between two near-zero tensors


def test_masked_loss_matches_transformers_mean_cross_entropy(tmp_path):
    ours = RoFormerForMaskedLM(RoFormerConfig(**TINY)).eval()
    randomize(ours, seed=2)
    save_pretrained(ours, tmp_path / "export")
    theirs, _ = load_hf(tmp_path / "export")
    input_ids, attention_mask, _ = inputs(seed=3)
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    labels[:, ::3] = input_ids[:, ::3]
    labels[attention_mask == 0] = IGNORE_INDEX
    with torch.no_grad():
        out = ours(input_ids, attention_mask, labels=labels)
        reference = theirs(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    torch.testing.assert_close(out.loss_sum / out.num_masked, reference, atol=1e-5, rtol=1e-5)


def test_transformers_checkpoint_loads_into_ours(tmp_path):
    hf_config = transformers.RoFormerConfig(**TINY, embedding_size=16, rotary_value=True, max_position_embeddings=64)
    torch.manual_seed(4)
    theirs = transformers.RoFormerForMaskedLM(hf_config).eval()
    randomize(theirs.roformer, seed=5)
    # our rebuild of transformers' frozen RoPE table matches the one transformers computes itself
    torch.testing.assert_close(theirs.roformer.encoder.embed_positions.weight,
                               hf_interop.transformers_sinusoidal_table(64, 8), atol=1e-6, rtol=0)
    theirs.save_pretrained(tmp_path / "hf")
    ours = load_pretrained(tmp_path / "hf").eval()
    assert ours.config.rotary_value and ours.config.embedding_size == 16
    input_ids, attention_mask, token_type_ids = inputs(seed=6)
    with torch.no_grad():
        expected = theirs(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).logits
        got = ours(input_ids, attention_mask, token_type_ids).logits
    assert (got - expected).abs().max().item() <= 1e-5


def test_round_trip_ours_to_transformers_and_back(tmp_path):
    ours = RoFormerForMaskedLM(RoFormerConfig(**TINY, embedding_size=16)).eval()
    randomize(ours, seed=7)
    save_pretrained(ours, tmp_path / "a")
    theirs, _ = load_hf(tmp_path / "a")
    theirs.save_pretrained(tmp_path / "b")  # transformers' own writer
    back = load_pretrained(tmp_path / "b")
    assert back.config == ours.config
    for key, tensor in ours.state_dict().items():
        assert torch.equal(back.state_dict()[key], tensor), key


def test_key_map_round_trip_and_unmapped_keys():
    state = RoFormerForMaskedLM(RoFormerConfig(**TINY, embedding_size=16)).state_dict()
    hf_state = to_hf_state_dict(state)
    assert "roformer.encoder.layer.1.attention.self.query.weight" in hf_state
    assert "roformer.embeddings_project.weight" in hf_state and "cls.predictions.bias" in hf_state
    assert from_hf_state_dict(hf_state).keys() == state.keys()
    with pytest.raises(ConfigError, match="roformer.embeddings.alibi.weight"):
        to_hf_state_dict({**state, "roformer.embeddings.alibi.weight": torch.zeros(1)})
    # A learned table maps (to the name a BERT's table is read under: roformer/bert_interop.py).
    assert "roformer.embeddings.position_embeddings.weight" in to_hf_state_dict(
        {**state, "roformer.embeddings.position.weight": torch.zeros(1)})
    with pytest.raises(ConfigError, match="roformer.pooler.dense.weight"):
        from_hf_state_dict({**hf_state, "roformer.pooler.dense.weight": torch.zeros(1)})


def test_config_round_trip():
    config = RoFormerConfig(**TINY, embedding_size=16, rotary_value=True, hidden_dropout_prob=0.0)
    hf = config_to_hf(config, max_position_embeddings=2048)
    assert hf["max_position_embeddings"] == 2048
    assert config_from_hf(hf) == config
    transformers.RoFormerConfig(**{k: v for k, v in hf.items() if k != "architectures"})  # transformers accepts it
    with pytest.raises(ConfigError, match="is_decoder"):
        config_from_hf({**hf, "is_decoder": True})
    with pytest.raises(ConfigError, match="model_type"):
        config_from_hf({**hf, "model_type": "bert"})


@pytest.mark.parametrize("overrides, field", [
    (dict(attention="linear"), "attention"),
    (dict(position_encoding="learned", max_position_embeddings=32), "position_encoding"),
    (dict(rope_theta=500000.0), "rope_theta"),
    (dict(rope_scaling="linear", rope_scaling_factor=2.0), "rope_scaling"),
])
def test_export_refuses_what_transformers_cannot_run(tmp_path, overrides, field):
    model = RoFormerForMaskedLM(RoFormerConfig(**{**TINY, **overrides}))
    with pytest.raises(ConfigError, match=rf"^{field}:"):
        save_pretrained(model, tmp_path / "export")
    assert list(tmp_path.iterdir()) == []


def test_save_is_atomic_and_never_clobbers(tmp_path, monkeypatch):
    model = RoFormerForMaskedLM(RoFormerConfig(**TINY))
    out = save_pretrained(model, tmp_path / "export")
    before = (out / "model.safetensors").read_bytes()
    with pytest.raises(FileExistsError):
        save_pretrained(model, out)

    def crash(*args, **kwargs):
        raise OSError("disk full")

    randomize(model, seed=8)
    monkeypatch.setattr(hf_interop, "save_file", crash)
    with pytest.raises(OSError, match="disk full"):
        save_pretrained(model, out, overwrite=True)
    assert (out / "model.safetensors").read_bytes() == before  # old export intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # no half-written leftovers
    monkeypatch.undo()
    save_pretrained(model, out, overwrite=True)
    assert (out / "model.safetensors").read_bytes() != before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def test_load_errors_name_the_problem(tmp_path):
    with pytest.raises(ConfigError, match="config.json: missing"):
        load_pretrained(tmp_path)
    out = save_pretrained(RoFormerForMaskedLM(RoFormerConfig(**TINY)), tmp_path / "export")
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "hidden_size": 30}))
    with pytest.raises(ConfigError, match="num_attention_heads"):
        load_pretrained(out)
    (out / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    with pytest.raises(ConfigError, match=r"missing: \['roformer.layers.2"):
        load_pretrained(out)
    (out / "config.json").write_text("{ not json")
    with pytest.raises(ConfigError, match="line 1"):
        load_pretrained(out)


def test_nonstandard_rope_table_is_refused(tmp_path):
    out = save_pretrained(RoFormerForMaskedLM(RoFormerConfig(**TINY)), tmp_path / "export", max_position_embeddings=64)
    tensors = safetensors.torch.load_file(str(out / "model.safetensors"))
    tensors[hf_interop.HF_ROPE_TABLE_KEY] = tensors[hf_interop.HF_ROPE_TABLE_KEY] * 0.5
    hf_interop.save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ConfigError, match="embed_positions"):
        load_pretrained(out)


def test_classifier_from_mlm_export_and_parity_with_transformers(tmp_path):
    mlm = RoFormerForMaskedLM(RoFormerConfig(**TINY)).eval()
    randomize(mlm, seed=9)
    export = save_pretrained(mlm, tmp_path / "mlm")
    classifier = load_classifier_from_pretrained(export, num_labels=3).eval()
    for key, tensor in mlm.roformer.state_dict().items():
        assert torch.equal(classifier.roformer.state_dict()[key], tensor), key
    # transformers' own classifier also starts from the export; only the heads differ
    _, info = load_hf(export, transformers.RoFormerForSequenceClassification, num_labels=3)
    assert {k.split(".")[0] for k in info["missing_keys"]} == {"classifier"}
    assert {k.split(".")[0] for k in info["unexpected_keys"]} <= {"cls"}
    # a fine-tuned classifier exports and matches transformers' classifier
    randomize(classifier, seed=10)
    save_pretrained(classifier, tmp_path / "cls")
    theirs, info = load_hf(tmp_path / "cls", transformers.RoFormerForSequenceClassification)
    assert info["missing_keys"] == set() and info["unexpected_keys"] == set()
    input_ids, attention_mask, token_type_ids = inputs(seed=11)
    with torch.no_grad():
        got = classifier(input_ids, attention_mask, token_type_ids).logits
        expected = theirs(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).logits
    assert got.shape == (3, 3) and (got - expected).abs().max().item() <= 1e-5
    reloaded = load_classifier_from_pretrained(tmp_path / "cls", num_labels=3).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids, attention_mask, token_type_ids).logits, got)
    assert isinstance(reloaded, RoFormerForSequenceClassification)

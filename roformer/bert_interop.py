"""Interoperability with transformers' BERT: a BERT read as a RoFormer, and a learned-position model written as a BERT.

A BERT is our `position_encoding: learned` model (word + token type + learned absolute positions,
post-LN blocks, a tied MLM head) under other names, so the map is one to one. Read, a BERT becomes
transformers-RoFormer-named tensors (the names roformer.hf_interop converts), so every loader of ours
takes it; with `position_encoding: rope` its absolute position table is dropped and RoPE takes its
place (the paper's route from WoBERT to RoFormer, section 4.5.2). Written, a learned-position model
is a `BertForMaskedLM` directory that plain transformers loads with no missing or unexpected keys.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from .config import ConfigError, RoFormerConfig
from .hf_keys import WEIGHT_FILES, read_weights, rename_keys, to_hf_state_dict

# transformers-RoFormer-side name of the learned position table: not in transformers' RoFormer (it has
# none), the name this module gives BERT's table so that the learned-position model loads like any other.
POSITION_KEY = "roformer.embeddings.position_embeddings.weight"
BERT_POSITION_KEY = "bert.embeddings.position_embeddings.weight"
# Tensors a BERT may hold that no model of ours has: never loaded, listed as dropped.
BERT_UNUSED_PREFIXES = ("bert.pooler.", "cls.seq_relationship.")
# Buffers transformers < 4.31 saved (the position and token type ids 0..P-1 and zeros): derived, skipped.
BERT_BUFFERS = ("bert.embeddings.position_ids", "bert.embeddings.token_type_ids")
BERT_TIED_KEYS = {"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
                  "cls.predictions.decoder.bias": "cls.predictions.bias"}
# The BERT defaults (transformers.BertConfig) for keys a config.json may omit, in our field names.
_BERT_DEFAULTS = {
    "vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
    "intermediate_size": 3072, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1, "type_vocab_size": 2, "initializer_range": 0.02,
    "layer_norm_eps": 1e-12, "pad_token_id": 0,
}
BERT_DEFAULT_MAX_POSITIONS = 512
# BERT config.json keys whose other values we cannot honour, with the one value we compute.
_BERT_FIXED = {"is_decoder": False, "add_cross_attention": False, "tie_word_embeddings": True,
               "position_embedding_type": "absolute"}
BERT_POSITION_ENCODINGS = ("rope", "learned")
"""What a BERT may be continued as: RoPE (its table dropped) or itself (table kept)."""


# ----------------------------------------------------------------------------------------------- names
def _bert_to_roformer_name(key: str) -> str | None:
    """BERT's name -> transformers RoFormer's (the naming roformer.hf_interop maps); None: no counterpart."""
    if key == BERT_POSITION_KEY:
        return POSITION_KEY
    if key.startswith("bert."):
        return "roformer." + key[len("bert."):]
    if key.startswith("cls.predictions."):
        return key
    return None


def _roformer_to_bert_name(key: str) -> str:
    if key == POSITION_KEY:
        return BERT_POSITION_KEY
    if key.startswith("roformer."):
        return "bert." + key[len("roformer."):]
    return key


def normalise_bert_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """BertForMaskedLM names for any BERT file: a bare BertModel's keys get the `bert.` prefix, and the
    TF-era `LayerNorm.gamma` / `LayerNorm.beta` (Google's converted checkpoints) become weight / bias."""
    bare = not any(key.startswith("bert.") for key in tensors)
    renamed = {}
    for key, tensor in tensors.items():
        if bare and not key.startswith("cls."):
            key = "bert." + key
        if key.endswith("LayerNorm.gamma"):
            key = key[:-len("gamma")] + "weight"
        elif key.endswith("LayerNorm.beta"):
            key = key[:-len("beta")] + "bias"
        renamed[key] = tensor
    return renamed


# ----------------------------------------------------------------------------------------------- configs
def config_from_bert(raw: dict[str, Any], position_encoding: str = "learned", source: str | None = None
                     ) -> RoFormerConfig:
    """Our config of a BERT config.json dict, continued with `position_encoding` (rope or learned)."""
    prefix = f"{source}: " if source else ""
    if raw.get("model_type") != "bert":
        raise ConfigError(f"{prefix}model_type: expected 'bert', got {raw.get('model_type')!r}")
    if position_encoding not in BERT_POSITION_ENCODINGS:
        raise ConfigError(f"{prefix}model.position_encoding: '{position_encoding}' cannot continue a BERT (its "
                          f"positions are a learned table): use rope (the table dropped) or learned (kept)")
    for key, allowed in _BERT_FIXED.items():
        if raw.get(key, allowed) != allowed:
            raise ConfigError(f"{prefix}{key}: {raw[key]!r} cannot be honoured (RoFormer-DS continues a BERT "
                              f"encoder with {key} = {allowed!r})")
    if raw.get("pad_token_id", 0) is None:
        raise ConfigError(f"{prefix}pad_token_id: null; RoFormer-DS needs the [PAD] id (set it in config.json)")
    values = {key: raw.get(key, default) for key, default in _BERT_DEFAULTS.items()}
    values["position_encoding"] = position_encoding
    if position_encoding == "learned":
        values["max_position_embeddings"] = raw.get("max_position_embeddings", BERT_DEFAULT_MAX_POSITIONS)
    return RoFormerConfig.from_dict(values, source=source)


def check_bert_exportable(config: RoFormerConfig) -> None:
    """A BERT is a learned-position softmax encoder with embeddings as wide as the hidden layers."""
    if config.position_encoding != "learned":
        raise ConfigError(f"position_encoding: only 'learned' exports as a BERT, got '{config.position_encoding}'")
    if config.attention != "softmax":
        raise ConfigError(f"attention: transformers' BERT only has softmax attention, got '{config.attention}'")
    if config.embedding_size != config.hidden_size:
        raise ConfigError(f"embedding_size: transformers' BERT has no embedding projection, so it must equal "
                          f"hidden_size {config.hidden_size}, got {config.embedding_size}")


def config_to_bert(config: RoFormerConfig) -> dict[str, Any]:
    """transformers BertConfig content of a learned-position model."""
    check_bert_exportable(config)
    return {"architectures": ["BertForMaskedLM"], "model_type": "bert",
            **{key: getattr(config, key) for key in _BERT_DEFAULTS},
            "max_position_embeddings": int(config.max_position_embeddings), "position_embedding_type": "absolute",
            "is_decoder": False, "add_cross_attention": False, "tie_word_embeddings": True, "dtype": "float32"}


# ----------------------------------------------------------------------------------------------- reading
def read_bert_weights(directory: str | Path, config: RoFormerConfig) -> tuple[dict[str, torch.Tensor], list[str]]:
    """(transformers-RoFormer-named tensors, BERT tensors dropped) of a transformers BERT directory
    (BertForMaskedLM, BertForPreTraining or BertModel) whose config.json gave `config` (config_from_bert;
    roformer.hf_interop.read_pretrained reads it): position_encoding 'rope' drops the absolute table,
    'learned' keeps it."""
    directory = Path(directory)
    tensors = normalise_bert_names(read_weights(directory))
    weights = directory / next((n for n in WEIGHT_FILES if (directory / n).is_file()), "weights")
    for tied, source in BERT_TIED_KEYS.items():
        if tied in tensors and source in tensors and not torch.equal(tensors[tied], tensors[source]):
            raise ConfigError(f"{weights}: {tied} differs from {source}, but the MLM decoder must be tied")
    table = tensors.get(BERT_POSITION_KEY)
    if table is None:
        raise ConfigError(f"{weights}: {BERT_POSITION_KEY} missing (a BERT has a learned position table)")
    dropped = sorted(key for key in tensors if key.startswith(BERT_UNUSED_PREFIXES))
    if config.position_encoding == "rope":
        dropped.insert(0, BERT_POSITION_KEY)
    elif table.shape[0] != config.max_position_embeddings:
        raise ConfigError(f"{weights}: {BERT_POSITION_KEY} has {table.shape[0]} rows, config.json "
                          f"max_position_embeddings says {config.max_position_embeddings}")
    skipped = {*dropped, *BERT_TIED_KEYS, *BERT_BUFFERS}
    mapped = {key: tensor for key, tensor in tensors.items() if key not in skipped}
    ours, unmapped = rename_keys(mapped, _bert_to_roformer_name)
    if unmapped:
        raise ConfigError(f"{weights}: no counterpart in RoFormer-DS for tensor(s) {', '.join(sorted(unmapped))}")
    return ours, dropped


def mlm_head_names(tensors: dict[str, torch.Tensor]) -> list[str]:
    """transformers' names of the MLM head a model directory lacked (a bare encoder), for the records."""
    return [] if any(key.startswith("cls.predictions.") for key in tensors) else \
        ["cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm", "cls.predictions.bias"]


# ----------------------------------------------------------------------------------------------- writing
def bert_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our learned-position model's parameters under BertForMaskedLM's names (the tied decoder omitted,
    as transformers' save_pretrained omits it)."""
    return {_roformer_to_bert_name(key): tensor for key, tensor in to_hf_state_dict(state_dict).items()}


def write_bert_files(model, directory: str | Path) -> None:
    """config.json + model.safetensors of a BertForMaskedLM into an existing directory (its caller
    writes into a temporary directory and swaps it into place)."""
    directory = Path(directory)
    bert_config = config_to_bert(model.config)
    tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in bert_state_dict(model.state_dict()).items()}
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    with open(directory / "config.json", "w", encoding="utf-8") as handle:
        json.dump(bert_config, handle, indent=2, sort_keys=True)
        handle.write("\n")
    for name in ("model.safetensors", "config.json"):
        with open(directory / name, "rb") as handle:
            os.fsync(handle.fileno())


__all__ = ["config_from_bert", "config_to_bert", "check_bert_exportable", "read_bert_weights",
           "bert_state_dict", "write_bert_files", "normalise_bert_names", "mlm_head_names", "POSITION_KEY",
           "BERT_POSITION_KEY", "BERT_POSITION_ENCODINGS"]

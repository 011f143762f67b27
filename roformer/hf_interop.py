"""Interoperability with transformers' RoFormer: one key map, config conversion, save and load.

An export directory is a plain transformers directory (config.json + model.safetensors) that
`transformers.RoFormerForMaskedLM.from_pretrained(dir)` loads with no missing or unexpected keys;
we read the same format back, so "our" and "transformers'" directories are one format.
Only models transformers can run map: RoPE (theta 10000, no scaling) with softmax attention.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from .bert_interop import config_from_bert, read_bert_weights
from .config import ConfigError, RoFormerConfig
from .hf_keys import (HF_ROPE_TABLE_KEY, HF_TIED_KEYS, KEY_MAP, check_derived_hf_keys, from_hf_state_dict,
                      read_weights, to_hf_state_dict)
from .model import RoFormerForMaskedLM, RoFormerForSequenceClassification
from .rope import transformers_sinusoidal_table

DEFAULT_HF_MAX_POSITIONS = 1536  # transformers' default; the longest stage of the paper's Table 4

# ----------------------------------------------------------------------------------------------- configs
_HF_DEFAULTS = {  # transformers.RoFormerConfig defaults, for keys a config.json may omit
    "vocab_size": 50000, "embedding_size": None, "hidden_size": 768, "num_hidden_layers": 12,
    "num_attention_heads": 12, "intermediate_size": 3072, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1, "type_vocab_size": 2, "initializer_range": 0.02,
    "layer_norm_eps": 1e-12, "pad_token_id": 0, "rotary_value": False,
}


def check_exportable(config: RoFormerConfig) -> None:
    """transformers' RoFormer is softmax attention with plain RoPE at base 10000; refuse anything else."""
    if config.position_encoding != "rope":
        raise ConfigError(f"position_encoding: transformers' RoFormer only has RoPE, got '{config.position_encoding}'"
                          + (" (a fixed sinusoidal table has no transformers counterpart either; only 'learned' runs "
                             "export, as BERT)" if config.position_encoding != "learned" else
                             " (a 'learned' model exports as BERT: roformer.bert_interop)"))
    if config.attention != "softmax":
        raise ConfigError(f"attention: transformers' RoFormer only has softmax attention, got '{config.attention}'")
    if config.rope_theta != 10000.0:
        raise ConfigError(f"rope_theta: transformers' RoFormer fixes it at 10000, got {config.rope_theta}")
    if config.rope_scaling != "none":
        raise ConfigError(f"rope_scaling: transformers' RoFormer has no RoPE scaling, got '{config.rope_scaling}'")


def config_to_hf(config: RoFormerConfig, max_position_embeddings: int = DEFAULT_HF_MAX_POSITIONS) -> dict[str, Any]:
    """transformers config.json content. `max_position_embeddings` is only the length of the RoPE
    table transformers precomputes (our model has no limit); transformers cannot go past it."""
    check_exportable(config)
    return {
        "architectures": ["RoFormerForMaskedLM"], "model_type": "roformer",
        **{key: getattr(config, key) for key in _HF_DEFAULTS},
        "max_position_embeddings": int(max_position_embeddings),
        "is_decoder": False, "add_cross_attention": False, "tie_word_embeddings": True, "dtype": "float32",
    }


def config_from_hf(hf_config: dict[str, Any], source: str | None = None) -> RoFormerConfig:
    """Our config from a transformers RoFormer config.json dict (generic transformers keys ignored)."""
    prefix = f"{source}: " if source else ""
    if hf_config.get("model_type") != "roformer":
        raise ConfigError(f"{prefix}model_type: {hf_config.get('model_type')!r} is not 'roformer' (RoFormer-DS reads "
                          f"two: 'roformer' here and 'bert' through roformer.bert_interop)")
    for key, allowed in (("is_decoder", False), ("add_cross_attention", False), ("tie_word_embeddings", True)):
        if hf_config.get(key, allowed) != allowed:
            raise ConfigError(f"{prefix}{key}: must be {allowed} for an encoder with tied MLM head")
    values = {key: hf_config.get(key, default) for key, default in _HF_DEFAULTS.items()}
    return RoFormerConfig.from_dict(values, source=source)


# ----------------------------------------------------------------------------------------------- saving
def write_pretrained_files(model: RoFormerForMaskedLM | RoFormerForSequenceClassification, directory: str | Path,
                           max_position_embeddings: int = DEFAULT_HF_MAX_POSITIONS) -> None:
    """Write config.json + model.safetensors into an existing directory (not atomic; see save_pretrained)."""
    directory = Path(directory)
    hf_config = config_to_hf(model.config, max_position_embeddings)
    if isinstance(model, RoFormerForSequenceClassification):
        hf_config["architectures"] = ["RoFormerForSequenceClassification"]
        hf_config["id2label"] = {str(i): f"LABEL_{i}" for i in range(model.num_labels)}
        hf_config["label2id"] = {f"LABEL_{i}": i for i in range(model.num_labels)}
    tensors = {k: v.detach().to("cpu", torch.float32).contiguous()
               for k, v in to_hf_state_dict(model.state_dict()).items()}
    tensors[HF_ROPE_TABLE_KEY] = transformers_sinusoidal_table(max_position_embeddings, model.config.head_size)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    with open(directory / "config.json", "w") as handle:
        json.dump(hf_config, handle, indent=2, sort_keys=True)
        handle.write("\n")
    for name in ("model.safetensors", "config.json"):
        with open(directory / name, "rb") as handle:
            os.fsync(handle.fileno())


def save_pretrained(model: RoFormerForMaskedLM | RoFormerForSequenceClassification, out_dir: str | Path,
                    max_position_embeddings: int = DEFAULT_HF_MAX_POSITIONS, overwrite: bool = False) -> Path:
    """Write a transformers-loadable directory atomically: build it next to out_dir, then rename.

    An existing out_dir is refused unless overwrite=True, in which case it is replaced only after the
    new directory is complete.
    """
    check_exportable(model.config)
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"{out_dir}: already exists (pass overwrite=True to replace it)")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        write_pretrained_files(model, staging, max_position_embeddings)
        if out_dir.exists():
            retired = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.replace(out_dir, retired / "previous")
            os.replace(staging, out_dir)
            shutil.rmtree(retired)
        else:
            os.replace(staging, out_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return out_dir


# ----------------------------------------------------------------------------------------------- loading
@dataclass(frozen=True)
class PretrainedDir:
    """A transformers model directory whose config.json was read once (`read_pretrained`): a RoFormer (ours or
    transformers') or a BERT (roformer/bert_interop.py), decided here and nowhere else."""

    directory: Path
    raw: dict[str, Any]
    """config.json as read."""

    @property
    def config_path(self) -> Path:
        return self.directory / "config.json"

    @property
    def is_bert(self) -> bool:
        return self.raw.get("model_type") == "bert"

    def config(self, position_encoding: str = "learned") -> RoFormerConfig:
        """Our config of it (ConfigError naming config.json); a BERT is continued with `position_encoding`
        (rope: its table dropped; learned: kept); a RoFormer has its own."""
        if self.is_bert:
            return config_from_bert(self.raw, position_encoding, source=str(self.config_path))
        return config_from_hf(self.raw, source=str(self.config_path))

    def weights(self, config: RoFormerConfig) -> tuple[dict[str, torch.Tensor], list[str]]:
        """(transformers-RoFormer-named tensors, tensors the model has no place for) for `config` (self.config's)."""
        if self.is_bert:
            return read_bert_weights(self.directory, config)
        tensors = read_weights(self.directory)
        if not any(key.startswith("roformer.") for key in tensors):  # saved from a bare RoFormerModel
            tensors = {f"roformer.{key}": value for key, value in tensors.items()}
        check_derived_hf_keys(tensors, config, self.directory)
        return tensors, []


def read_pretrained(directory: str | Path) -> PretrainedDir:
    """DIR's config.json, read once; ConfigError when it is missing or not a JSON object."""
    directory = Path(directory)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ConfigError(f"{config_path}: missing (not a transformers model directory)")
    try:
        raw = json.loads(config_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ConfigError(f"{config_path}: invalid JSON at line {error.lineno}: {error.msg}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{config_path}: not a transformers config (a JSON object)")
    return PretrainedDir(directory, raw)


def read_hf_directory(directory: str | Path) -> tuple[RoFormerConfig, dict[str, torch.Tensor], dict[str, Any]]:
    """(our config, transformers-named tensors, raw config.json) of a transformers RoFormer directory,
    or of a BERT (continued as the learned-position model it is: our learned-run exports)."""
    pretrained = read_pretrained(directory)
    config = pretrained.config()
    tensors, _ = pretrained.weights(config)
    return config, tensors, pretrained.raw


def load_pretrained(directory: str | Path) -> RoFormerForMaskedLM:
    """Our MLM model from our export or any transformers RoFormerForMaskedLM directory (strict keys)."""
    config, tensors, _ = read_hf_directory(directory)
    model = RoFormerForMaskedLM(config)
    ours = from_hf_state_dict({k: v for k, v in tensors.items() if not k.startswith("classifier.")})
    _load_strict(model, ours, directory)
    return model


def load_classifier_from_pretrained(directory: str | Path, num_labels: int,
                                    **config_changes) -> RoFormerForSequenceClassification:
    """A classifier whose encoder comes from an export (MLM head ignored). A classifier head is taken
    from the directory when it has one of the right size, else freshly initialised. `config_changes`
    replace config fields that do not change the weights' shapes (e.g. the dropout probabilities)."""
    config, tensors, _ = read_hf_directory(directory)
    config = dataclasses.replace(config, **config_changes) if config_changes else config
    model = RoFormerForSequenceClassification(config, num_labels)
    ours = from_hf_state_dict({k: v for k, v in tensors.items() if not k.startswith("cls.")})
    head = {k: v for k, v in ours.items() if k.startswith("classifier.")}
    if head and head["classifier.out_proj.weight"].shape[0] != num_labels:
        head = {}
    encoder = {k: v for k, v in ours.items() if not k.startswith("classifier.")}
    if not head:
        head = {k: v for k, v in model.state_dict().items() if k.startswith("classifier.")}
    _load_strict(model, {**encoder, **head}, directory)
    return model


def load_mlm_weights(model: RoFormerForMaskedLM, tensors: dict[str, torch.Tensor], where) -> bool:
    """transformers-named `tensors` (read_hf_directory) of a RoFormerForMaskedLM, or of a bare RoFormerModel,
    into `model` (strict names and shapes; a classifier head is ignored). Without MLM head tensors the
    model keeps its own, freshly initialised head. Returns True when the head is new."""
    ours = from_hf_state_dict({k: v for k, v in tensors.items() if not k.startswith("classifier.")})
    new_head = not any(key.startswith("mlm_head.") for key in ours)
    if new_head:
        ours.update({k: v for k, v in model.state_dict().items() if k.startswith("mlm_head.")})
    _load_strict(model, ours, where)
    return new_head


def _load_strict(model: torch.nn.Module, state_dict: dict[str, torch.Tensor], where) -> None:
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    if missing or unexpected:
        raise ConfigError(f"{where}: weights do not match the config (missing: {missing or 'none'}; "
                          f"unexpected: {unexpected or 'none'})")
    wrong = [f"{k} {tuple(v.shape)} != {tuple(expected[k].shape)}" for k, v in state_dict.items()
             if v.shape != expected[k].shape]
    if wrong:
        raise ConfigError(f"{where}: tensor shapes do not match the config: {'; '.join(wrong)}")
    model.load_state_dict({k: v.to(expected[k].dtype) for k, v in state_dict.items()}, strict=True)


__all__ = ["KEY_MAP", "to_hf_state_dict", "from_hf_state_dict", "config_to_hf", "config_from_hf",
           "save_pretrained", "write_pretrained_files", "load_pretrained", "load_classifier_from_pretrained",
           "read_hf_directory", "check_exportable", "load_mlm_weights", "PretrainedDir", "read_pretrained"]

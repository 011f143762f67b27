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
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from .config import ConfigError, RoFormerConfig
from .model import RoFormerForMaskedLM, RoFormerForSequenceClassification
from .rope import transformers_sinusoidal_table

# ----------------------------------------------------------------------------------------------- the key map
# (our name, transformers' name); {i} = layer index, {p} = weight|bias. The single place where the two
# naming schemes meet: both directions are derived from this table.
KEY_MAP: tuple[tuple[str, str], ...] = (
    ("roformer.embeddings.word.weight", "roformer.embeddings.word_embeddings.weight"),
    ("roformer.embeddings.token_type.weight", "roformer.embeddings.token_type_embeddings.weight"),
    ("roformer.embeddings.norm.{p}", "roformer.embeddings.LayerNorm.{p}"),
    # Only learned-position models have it, and they export as BERT (roformer/bert_interop.py): a name of
    # our own on transformers' side, so that a BERT's tensors load through this one map.
    ("roformer.embeddings.position.weight", "roformer.embeddings.position_embeddings.weight"),
    ("roformer.embeddings.project.{p}", "roformer.embeddings_project.{p}"),
    ("roformer.layers.{i}.attention.query.{p}", "roformer.encoder.layer.{i}.attention.self.query.{p}"),
    ("roformer.layers.{i}.attention.key.{p}", "roformer.encoder.layer.{i}.attention.self.key.{p}"),
    ("roformer.layers.{i}.attention.value.{p}", "roformer.encoder.layer.{i}.attention.self.value.{p}"),
    ("roformer.layers.{i}.attention.output.{p}", "roformer.encoder.layer.{i}.attention.output.dense.{p}"),
    ("roformer.layers.{i}.attention_norm.{p}", "roformer.encoder.layer.{i}.attention.output.LayerNorm.{p}"),
    ("roformer.layers.{i}.ffn_in.{p}", "roformer.encoder.layer.{i}.intermediate.dense.{p}"),
    ("roformer.layers.{i}.ffn_out.{p}", "roformer.encoder.layer.{i}.output.dense.{p}"),
    ("roformer.layers.{i}.ffn_norm.{p}", "roformer.encoder.layer.{i}.output.LayerNorm.{p}"),
    ("mlm_head.dense.{p}", "cls.predictions.transform.dense.{p}"),
    ("mlm_head.norm.{p}", "cls.predictions.transform.LayerNorm.{p}"),
    ("mlm_head.bias", "cls.predictions.bias"),
    ("classifier.dense.{p}", "classifier.dense.{p}"),
    ("classifier.out_proj.{p}", "classifier.out_proj.{p}"),
)
# transformers keys that carry no information of their own: the frozen RoPE table (rebuilt from the
# config) and the decoder tied to the word embeddings / output bias.
HF_ROPE_TABLE_KEY = "roformer.encoder.embed_positions.weight"
HF_TIED_KEYS = {"cls.predictions.decoder.weight": "roformer.embeddings.word_embeddings.weight",
                "cls.predictions.decoder.bias": "cls.predictions.bias"}
DEFAULT_HF_MAX_POSITIONS = 1536  # transformers' default; the longest stage of the paper's Table 4

_PLACEHOLDERS = {"{i}": r"(?P<i>\d+)", "{p}": r"(?P<p>weight|bias)"}


def _compile(pattern: str) -> re.Pattern:
    regex = re.escape(pattern)
    for placeholder, group in _PLACEHOLDERS.items():
        regex = regex.replace(re.escape(placeholder), group)
    return re.compile(f"^{regex}$")


_TO_HF = [(_compile(ours), hf) for ours, hf in KEY_MAP]
_FROM_HF = [(_compile(hf), ours) for ours, hf in KEY_MAP]


def _rename(key: str, rules: list[tuple[re.Pattern, str]]) -> str | None:
    for regex, template in rules:
        match = regex.match(key)
        if match:
            return template.format(**match.groupdict())
    return None


def rename_keys(tensors: dict[str, torch.Tensor], rename) -> tuple[dict[str, torch.Tensor], list[str]]:
    """`tensors` under `rename(key)`'s names, and the keys it has no name for (None), apart."""
    renamed, unmapped = {}, []
    for key, tensor in tensors.items():
        name = rename(key)
        if name is None:
            unmapped.append(key)
        else:
            renamed[name] = tensor
    return renamed, unmapped


def _convert(state_dict: dict[str, torch.Tensor], rules, what: str) -> dict[str, torch.Tensor]:
    converted, unmapped = rename_keys(state_dict, lambda key: _rename(key, rules))
    if unmapped:
        raise ConfigError(f"{what}: no mapping for key(s) {', '.join(sorted(unmapped))}")
    return converted


def to_hf_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our parameter names -> transformers' (without the derived RoPE table and tied decoder)."""
    return _convert(state_dict, _TO_HF, "to_hf_state_dict")


def from_hf_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' names -> ours. The derived keys (RoPE table, tied decoder) are dropped; check
    them first with `check_derived_hf_keys` when they come from a file."""
    kept = {k: v for k, v in state_dict.items() if k != HF_ROPE_TABLE_KEY and k not in HF_TIED_KEYS}
    return _convert(kept, _FROM_HF, "from_hf_state_dict")


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
def read_hf_directory(directory: str | Path) -> tuple[RoFormerConfig, dict[str, torch.Tensor], dict[str, Any]]:
    """(our config, transformers-named tensors, raw config.json) of a transformers RoFormer directory,
    or of a BERT (roformer/bert_interop.py: the learned-position model it is, our learned-run exports)."""
    directory = Path(directory)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ConfigError(f"{config_path}: missing (not a transformers model directory)")
    try:
        raw = json.loads(config_path.read_text())
    except json.JSONDecodeError as error:
        raise ConfigError(f"{config_path}: invalid JSON at line {error.lineno}: {error.msg}") from None
    if isinstance(raw, dict) and raw.get("model_type") == "bert":
        from .bert_interop import read_bert_directory

        config, tensors, raw, _ = read_bert_directory(directory, "learned")
        return config, tensors, raw
    config = config_from_hf(raw, source=str(config_path))
    tensors = _read_weights(directory)
    if not any(key.startswith("roformer.") for key in tensors):  # saved from a bare RoFormerModel
        tensors = {f"roformer.{key}": value for key, value in tensors.items()}
    check_derived_hf_keys(tensors, config, directory)
    return config, tensors, raw


def _read_weights(directory: Path) -> dict[str, torch.Tensor]:
    if (directory / "model.safetensors").is_file():
        return load_file(str(directory / "model.safetensors"))
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        tensors = {}
        for shard in shards:
            tensors.update(load_file(str(directory / shard)))
        return tensors
    if (directory / "pytorch_model.bin").is_file():
        return torch.load(directory / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise ConfigError(f"{directory}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin")


def check_derived_hf_keys(tensors: dict[str, torch.Tensor], config: RoFormerConfig, where: Path | str) -> None:
    """The keys we drop on import must hold what we would rebuild, or the weights mean something else."""
    table = tensors.get(HF_ROPE_TABLE_KEY)
    if table is not None:
        expected = transformers_sinusoidal_table(table.shape[0], config.head_size)
        if table.shape != expected.shape or not torch.allclose(table.float(), expected, atol=1e-5):
            raise ConfigError(f"{where}: {HF_ROPE_TABLE_KEY} is not the standard RoPE table (base 10000, "
                              f"head size {config.head_size})")
    for tied, source in HF_TIED_KEYS.items():
        if tied in tensors and source in tensors and not torch.equal(tensors[tied], tensors[source]):
            raise ConfigError(f"{where}: {tied} differs from {source}, but the MLM decoder must be tied")


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
           "read_hf_directory", "check_exportable", "load_mlm_weights"]

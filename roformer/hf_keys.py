"""transformers' side of a model directory, shared by roformer/hf_interop.py (RoFormer) and roformer/bert_interop.py
(BERT): the one key map between our parameter names and transformers', and the reader of a directory's weight
files. Below both, so neither imports the other's internals.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import load_file

from .config import ConfigError, RoFormerConfig
from .rope import transformers_sinusoidal_table

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
"""Where transformers' save_pretrained puts the weights, in the order `read_weights` reads them."""

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


def read_weights(directory: Path) -> dict[str, torch.Tensor]:
    """The tensors of a transformers directory's weights file (WEIGHT_FILES), under the file's own names."""
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
    raise ConfigError(f"{directory}: no {', '.join(WEIGHT_FILES)}")


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

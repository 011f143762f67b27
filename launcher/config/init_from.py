"""`init_from` of a run config (`roformer pretrain --init-from DIR`): the model section over DIR's.

DIR is our export or any local transformers RoFormer directory. Its config.json is read by the caller
(launcher/inputs/init_from.py, which also reads the weights and the tokenizer); here only the rule of laying
the run config's own `model:` keys (and `--set model.*`) over DIR's: a key that would give a weight another
shape, or make the weights mean something else (WEIGHT_FIELDS), is refused when it differs from DIR's, naming
both values; the dropouts, initializer_range and the RoPE / attention variants may change.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from launcher.errors import UserError
from roformer.config import ConfigError, RoFormerConfig

WEIGHT_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                 "embedding_size", "type_vocab_size", "position_encoding", "max_position_embeddings",
                 "pad_token_id")
"""Model fields fixed by DIR's weights: their shapes (sizes, position tables) or their meaning (how the
hidden size splits into heads, which embedding row is padding)."""

InitModelReader = Callable[[str, str], tuple[dict, Path]]
"""(init_from directory, config source) -> (DIR's model fields, the config.json they came from)."""


def model_over_init(init_dir: str, base: dict, config_path: Path, explicit: dict | None, source: str) -> RoFormerConfig:
    """DIR's model fields (`base`, read from `config_path`) with the run config's `model:` keys (`explicit`,
    None = no section) laid over them."""
    values = dict(base)
    for key, value in (explicit or {}).items():
        if key in WEIGHT_FIELDS and key in values and value != values[key]:
            raise UserError(f"{source}: model.{key}: {value!r} differs from {values[key]!r} in {config_path} "
                            f"(init_from {init_dir}): it changes the shape or meaning of the weights; drop "
                            f"model.{key} or set it to {values[key]!r}")
        values[key] = value
    try:
        return RoFormerConfig.from_dict(values, source=f"{source}: model (over {config_path})")
    except ConfigError as err:
        raise UserError(str(err)) from None

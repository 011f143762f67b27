"""Model configuration: one validated dataclass, the single source of truth for the architecture."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any


POSITION_ENCODINGS = ("rope", "sinusoidal", "sinusoidal_unscaled", "learned")
# Fixed sine/cosine tables: 'sinusoidal' as Vaswani et al. (token embeddings x sqrt(embedding_size)),
# 'sinusoidal_unscaled' the plain sum (word embeddings of std 0.02 + a table of RMS ~0.7).
SINUSOIDAL_ENCODINGS = ("sinusoidal", "sinusoidal_unscaled")
ATTENTION_KINDS = ("softmax", "linear")
ROPE_SCALINGS = ("none", "linear", "ntk")
# `hidden_act`: names as transformers' ACT2FN, so exported configs load there (the functions:
# roformer/activations.py; here the names only, so the config layer validates without torch).
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish")

# Fields that do not change the function a set of weights computes: they may differ between a
# checkpoint and a resumed run without making the checkpoint incompatible.
NON_ARCHITECTURE_FIELDS = frozenset({"hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range"})


class ConfigError(ValueError):
    """Bad model configuration; the message names the offending field (and file when known)."""


@dataclass
class RoFormerConfig:
    """Architecture of a RoFormer encoder (defaults = the small demo model)."""

    vocab_size: int = 8000
    """Number of token ids, including the tokenizer's special tokens (ours at 0-4, BERT's at 0 and 100-103)."""
    hidden_size: int = 256
    """Width of the transformer layers."""
    num_hidden_layers: int = 4
    """Number of post-LN encoder blocks."""
    num_attention_heads: int = 4
    """Attention heads per block; hidden_size must divide evenly, and the head size must be even for RoPE."""
    intermediate_size: int = 1024
    """Width of the feed-forward layer inside each block."""
    embedding_size: int | None = None
    """Width of the token embeddings (factorized as in transformers' RoFormer); None means hidden_size.
    When it differs from hidden_size a Linear projects embeddings up to hidden_size."""
    hidden_act: str = "gelu"
    """Activation of the feed-forward layer, the MLM transform and the classifier head."""
    hidden_dropout_prob: float = 0.1
    """Dropout on embeddings and on every residual branch."""
    attention_probs_dropout_prob: float = 0.1
    """Dropout on softmax attention probabilities (linear attention has no probabilities to drop)."""
    layer_norm_eps: float = 1e-12
    """Epsilon of every LayerNorm."""
    type_vocab_size: int = 2
    """Number of token type (segment) ids."""
    pad_token_id: int = 0
    """Id of [PAD] (the data manifest's special_ids.pad_token); its embedding row gets no gradient from the lookup."""
    initializer_range: float = 0.02
    """Std of the normal init of Linear and Embedding weights (as transformers)."""
    rotary_value: bool = False
    """Also rotate the values (transformers' RoFormer option)."""
    rope_theta: float = 10000.0
    """RoPE base: theta_i = rope_theta ** (-2(i-1)/d), i = 1..d/2 (the paper uses 10000)."""
    rope_scaling: str = "none"
    """Longer-context variant of RoPE: 'none', 'linear' (positions divided by the factor, i.e. position
    interpolation) or 'ntk' (NTK-aware: base multiplied by factor ** (d / (d - 2)))."""
    rope_scaling_factor: float = 1.0
    """Factor of rope_scaling; must be 1.0 with 'none' and >= 1.0 otherwise."""
    position_encoding: str = "rope"
    """'rope' (rotary, no maximum length), or the paper's baselines: absolute positions added to the
    token embeddings, 'learned' (BERT), 'sinusoidal' (Vaswani et al.: the fixed sine/cosine table added
    to the token embeddings multiplied by sqrt(embedding_size)) or 'sinusoidal_unscaled' (the same table
    added to unscaled embeddings: with std-0.02 embeddings the table, RMS ~0.7, drowns the tokens)."""
    max_position_embeddings: int | None = None
    """Length of the absolute position table; required by 'sinusoidal' and 'learned', not allowed with
    'rope' (RoPE models have no maximum length)."""
    attention: str = "softmax"
    """'softmax' (scaled_dot_product_attention) or 'linear' (the paper's eq. 19, O(N))."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "type_vocab_size"):
            _require_int(name, getattr(self, name), minimum=1)
        if self.embedding_size is None:
            self.embedding_size = self.hidden_size
        _require_int("embedding_size", self.embedding_size, minimum=1)
        _require_int("pad_token_id", self.pad_token_id, minimum=0)
        if self.pad_token_id >= self.vocab_size:
            raise ConfigError(f"pad_token_id: {self.pad_token_id} is not < vocab_size {self.vocab_size}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(f"num_attention_heads: hidden_size {self.hidden_size} is not divisible by "
                              f"num_attention_heads {self.num_attention_heads}")
        _require_choice("hidden_act", self.hidden_act, ACTIVATIONS)
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            value = _require_float(name, getattr(self, name))
            if not 0.0 <= value < 1.0:
                raise ConfigError(f"{name}: must be in [0, 1), got {value}")
            setattr(self, name, value)
        for name in ("layer_norm_eps", "initializer_range", "rope_theta"):
            value = _require_float(name, getattr(self, name))
            if not value > 0.0:
                raise ConfigError(f"{name}: must be > 0, got {value}")
            setattr(self, name, value)
        if not isinstance(self.rotary_value, bool):
            raise ConfigError(f"rotary_value: must be true or false, got {self.rotary_value!r}")
        _require_choice("rope_scaling", self.rope_scaling, ROPE_SCALINGS)
        self.rope_scaling_factor = _require_float("rope_scaling_factor", self.rope_scaling_factor)
        if self.rope_scaling == "none" and self.rope_scaling_factor != 1.0:
            raise ConfigError(f"rope_scaling_factor: must be 1.0 when rope_scaling is 'none', "
                              f"got {self.rope_scaling_factor}")
        if self.rope_scaling != "none" and not self.rope_scaling_factor >= 1.0:
            raise ConfigError(f"rope_scaling_factor: must be >= 1.0, got {self.rope_scaling_factor}")
        _require_choice("position_encoding", self.position_encoding, POSITION_ENCODINGS)
        _require_choice("attention", self.attention, ATTENTION_KINDS)
        if self.position_encoding == "rope":
            if self.max_position_embeddings is not None:
                raise ConfigError("max_position_embeddings: not allowed with position_encoding 'rope' "
                                  "(RoPE models have no maximum length)")
            if self.head_size % 2:
                raise ConfigError(f"num_attention_heads: RoPE needs an even head size, got "
                                  f"{self.hidden_size} / {self.num_attention_heads} = {self.head_size}")
        else:
            if self.max_position_embeddings is None:
                raise ConfigError(f"max_position_embeddings: required with position_encoding "
                                  f"'{self.position_encoding}'")
            _require_int("max_position_embeddings", self.max_position_embeddings, minimum=1)
            if self.position_encoding in SINUSOIDAL_ENCODINGS and self.embedding_size % 2:
                raise ConfigError(f"embedding_size: sinusoidal positions need an even size, got {self.embedding_size}")
            if self.rotary_value or self.rope_scaling != "none":
                raise ConfigError("rotary_value: RoPE options need position_encoding 'rope'"
                                  if self.rotary_value else
                                  "rope_scaling: RoPE options need position_encoding 'rope'")

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str | None = None) -> "RoFormerConfig":
        """Build from a plain dict (a YAML/JSON section); unknown keys are rejected by name.

        `source` (e.g. "run.yaml: model") prefixes error messages so the user finds the file.
        """
        prefix = f"{source}: " if source else ""
        if not isinstance(values, dict):
            raise ConfigError(f"{prefix}model config must be a mapping, got {type(values).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"{prefix}unknown model config field(s): {', '.join(map(str, unknown))} "
                              f"(known: {', '.join(sorted(known))})")
        try:
            return cls(**values)
        except ConfigError as error:
            raise ConfigError(f"{prefix}{error}") from None

    def diff(self, other: "RoFormerConfig") -> list[str]:
        """Names of architecture fields whose values differ (dropouts and init std are ignored)."""
        return [f.name for f in dataclasses.fields(self)
                if f.name not in NON_ARCHITECTURE_FIELDS and getattr(self, f.name) != getattr(other, f.name)]


MAX_SIZE = 2**31 - 1
"""The largest size field: torch's kernels index a dimension with int32 (and the shards hold uint32 ids);
a larger value is a typo whose estimates overflow every table."""


def _require_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name}: must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{name}: must be >= {minimum}, got {value}")
    if value > MAX_SIZE:
        raise ConfigError(f"{name}: {value:,} is larger than any model dimension (at most {MAX_SIZE:,})")


def _require_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name}: must be a number, got {value!r}")
    return require_finite(name, value)


def require_finite(name: str, value: int | float) -> float:
    """`value` as a float; inf and nan (YAML's .inf, an int beyond float's range) refused naming `name`."""
    try:
        value = float(value)
    except OverflowError:
        value = math.inf
    if not math.isfinite(value):
        raise ConfigError(f"{name}: must be a finite number, got {value}")
    return value


def _require_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{name}: must be one of {', '.join(choices)}; got {value!r}")


__all__ = ["ConfigError", "RoFormerConfig", "POSITION_ENCODINGS", "SINUSOIDAL_ENCODINGS", "ATTENTION_KINDS", "ROPE_SCALINGS", "ACTIVATIONS"]

"""The activation functions a config may name (`hidden_act`): the single list both the config
validation and the model read. Names follow transformers' ACT2FN so exported configs load there."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


ACTIVATION_FUNCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": _gelu_tanh,
    "gelu_pytorch_tanh": _gelu_tanh,
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}

__all__ = ["ACTIVATION_FUNCTIONS"]

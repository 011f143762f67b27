"""The activation function of each name a config may give (`hidden_act`, roformer.config.ACTIVATIONS)."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from .config import ACTIVATIONS


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

if tuple(ACTIVATION_FUNCTIONS) != ACTIVATIONS:  # the model must compute every name the config accepts
    raise ImportError(f"roformer.activations names {tuple(ACTIVATION_FUNCTIONS)}, roformer.config {ACTIVATIONS}")

__all__ = ["ACTIVATION_FUNCTIONS"]

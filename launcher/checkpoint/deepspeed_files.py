"""DeepSpeed's checkpoint files read with torch.load(weights_only=True): tensors, containers and the few DeepSpeed
objects its states hold (the loss scaler, the ZeRO stage), nothing that runs code."""
from __future__ import annotations

import enum
import pickle
from pathlib import Path


def load_deepspeed_file(path: Path):
    """One file of a DeepSpeed checkpoint (a model or optimizer state, a universal checkpoint's parameter file)."""
    import torch
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    allowed = [LossScaler, DynamicLossScaler, ZeroStageEnum, (_enum_member, "builtins.getattr")]
    with torch.serialization.safe_globals(allowed):
        return torch.load(path, map_location="cpu", weights_only=True)


def _enum_member(owner: object, name: str) -> enum.Enum:
    """`getattr(EnumClass, name)`, the form in which some Python versions pickle an Enum member (3.11.2, Debian 12's,
    does; 3.11.7 pickles `EnumClass(value)`), for allowed Enum classes' members only: any other getattr is refused."""
    if isinstance(owner, type) and issubclass(owner, enum.Enum) and name in owner.__members__:
        return owner[name]
    raise pickle.UnpicklingError(f"refused getattr({owner!r}, {name!r}): a checkpoint may only name an Enum member "
                                 "this way")

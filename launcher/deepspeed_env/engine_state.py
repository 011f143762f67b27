"""How a run's DeepSpeed engine stands, answered once, below launcher.checkpoint and launcher.train
(which both ask): its fp16 loss scale and that scale's floor, and the seeding of every random generator. Its shape
(ZeRO stage, precision, world size) is resolved once with the DeepSpeed configs it is built from
(launcher/config/run_shape.py RunShape, in the rank's RunSetup).
"""
from __future__ import annotations

import random

import numpy as np
import torch
from deepspeed.accelerator import get_accelerator


def loss_scale(engine) -> float:
    """The dynamic fp16 loss scale (1.0 when there is none: fp32 / bf16)."""
    optimizer = engine.optimizer
    for path in ("loss_scale", "cur_scale", "loss_scale_config.cur_scale", "loss_scaler.cur_scale"):
        value = optimizer
        try:
            for attr in path.split("."):
                value = getattr(value, attr)
        except AttributeError:
            continue
        if isinstance(value, (int, float, torch.Tensor)):
            return float(value)
    return 1.0


def min_loss_scale(engine, guard_on: bool = False) -> float | None:
    """The floor of the dynamic fp16 loss scale (fp16.min_loss_scale); None without dynamic loss scaling.
    guard_on: an overflow at the floor skips the step (as any overflow) instead of raising DeepSpeed's
    exception, so the numerics guard's rule stops or rewinds the run, recorded, rather than a crash."""
    optimizer = engine.optimizer
    scaler = getattr(optimizer, "loss_scaler", None)
    if scaler is not None and getattr(scaler, "dynamic", False) and hasattr(scaler, "min_scale"):
        if guard_on and hasattr(scaler, "raise_error_at_min_scale"):
            scaler.raise_error_at_min_scale = False
        return float(scaler.min_scale)
    config = getattr(optimizer, "loss_scale_config", None)  # ZeRO-0 fp16 (FP16_Optimizer)
    if config is not None and getattr(config, "dynamic_loss_scale", False) and config.min_loss_scale is not None:
        return float(config.min_loss_scale)
    return None


def seed_everything(seed: int) -> None:
    """Python's, NumPy's, torch's and the accelerator's generators from one seed."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    get_accelerator().manual_seed_all(seed)

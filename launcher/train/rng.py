"""Random generators of one rank (python, numpy, torch CPU, accelerator): seeding, save and restore.

Saved per rank as RUN_DIR/checkpoints/<tag>/rng_rank<r>.pt in plain types only, so it loads back
with torch.load(weights_only=True).
"""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch
from deepspeed.accelerator import get_accelerator

from launcher.io import atomic_torch_save
from launcher.run_dir.layout import rng_path


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    get_accelerator().manual_seed_all(seed)


def save_rng(checkpoint_dir: Path, rank: int) -> None:
    python, numpy_state = random.getstate(), np.random.get_state()
    portable = {"python": [python[0], list(python[1]), python[2]],
                "numpy": [numpy_state[0], torch.from_numpy(numpy_state[1].astype(np.int64)), *numpy_state[2:]],
                "torch_cpu": torch.get_rng_state(), "accelerator": get_accelerator().get_rng_state()}
    atomic_torch_save(portable, rng_path(checkpoint_dir, rank))


def load_rng(checkpoint_dir: Path, rank: int) -> bool:
    """Restore this rank's generators; False when the checkpoint has none for this rank (other world size)."""
    path = rng_path(checkpoint_dir, rank)
    if not path.is_file():
        return False
    state = torch.load(path, weights_only=True)
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch_cpu"])
    get_accelerator().set_rng_state(state["accelerator"])
    return True


def restore_rng(checkpoint_dir: Path, rank: int, same_world_size: bool, fresh_seed: int) -> None:
    """This rank's generators as the checkpoint saved them; fresh streams from `fresh_seed` when it was
    written at another world size (its ranks' streams are not this one's) or holds none for this rank."""
    if not (same_world_size and load_rng(checkpoint_dir, rank)):
        seed_everything(fresh_seed)

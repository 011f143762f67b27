"""The CUDA wheel matrix of the pinned torch, read from its one home: scripts/torch_variant.py (TORCH_CUDA_MATRIX,
beside TORCH_VERSION; set-up runs that script before .venv exists, so it cannot import the launcher). Imports no
torch."""
from __future__ import annotations

import importlib.util
import sys
from functools import lru_cache
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "torch_variant.py"


@lru_cache(maxsize=1)
def torch_variant():
    """scripts/torch_variant.py as a module (registered first: its dataclasses look their module up)."""
    name = "roformer_torch_variant"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def covers(archs, capability: tuple[int, int]) -> bool:
    """Whether wheels built for `archs` (torch.cuda.get_arch_list()'s 'sm_70', 'compute_90') run on `capability`."""
    return torch_variant().covers(archs, capability)


def fix_tag(capabilities, driver_cuda: tuple[int, int] | None) -> str:
    """The published line to install for these GPUs and driver (cu126 when none fits: it carries the most)."""
    return torch_variant().tag_for(capabilities, driver_cuda) or "cu126"


def fix_hint(capabilities, driver_cuda: tuple[int, int] | None) -> str:
    return torch_variant().FIX_HINT.format(tag=fix_tag(capabilities, driver_cuda))

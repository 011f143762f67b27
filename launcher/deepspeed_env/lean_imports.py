"""DeepSpeed without the parts a rank never runs, whose imports cost seconds at every start."""
from __future__ import annotations

import sys
import types
from contextlib import contextmanager

# DeepSpeed imports its Muon modules to ask "is this Muon?" (ZeRO's support check, every gradient
# reduction); they compile their kernels at import (torch._inductor: 1-1.5 s of every rank's start).
MUON_OPTIMIZER = "deepspeed.runtime.zero.muon.muon_optimizer"
MUON_KERNELS = "deepspeed.runtime.zero.muon.original_muon"


@contextmanager
def unimportable(name: str):
    """`import name` fails at once inside the block (DeepSpeed's optional imports expect that)."""
    absent = name not in sys.modules
    if absent:
        sys.modules[name] = None
    try:
        yield
    finally:
        if absent and sys.modules.get(name, 0) is None:
            del sys.modules[name]


def import_deepspeed() -> None:
    """DeepSpeed's autotuner, never run by a rank, imports MLflow whenever it is installed (the `track`
    extra: a second or more of pandas and scipy); a run that reports to MLflow imports it later."""
    with unimportable("mlflow"):
        import deepspeed  # noqa: F401


def answer_not_muon(optimizer_type: str) -> None:
    """For a run whose optimizer is not Muon: DeepSpeed's "is this Muon?" answered by stand-ins (a class
    no optimizer is an instance of, an update that is never called) instead of the compiled modules."""
    if optimizer_type.lower() == "muon" or MUON_OPTIMIZER in sys.modules or MUON_KERNELS in sys.modules:
        return
    optimizer = types.ModuleType(MUON_OPTIMIZER, "Stands in for DeepSpeed's Muon in a run without it.")
    optimizer.MuonWithAuxAdam = type("MuonWithAuxAdam", (), {})
    kernels = types.ModuleType(MUON_KERNELS, "Stands in for DeepSpeed's Muon kernels in a run without it.")
    kernels.muon_update = _no_muon_update
    sys.modules.update({MUON_OPTIMIZER: optimizer, MUON_KERNELS: kernels})


def _no_muon_update(*args, **kwargs):
    raise RuntimeError("DeepSpeed called Muon's update in a run whose optimizer is not Muon "
                       "(launcher/deepspeed_env/lean_imports.py answers DeepSpeed's Muon questions for such runs)")

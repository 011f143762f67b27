"""DeepSpeed without the parts a rank never runs, whose imports or builds cost seconds at every start."""
from __future__ import annotations

import importlib
import sys
import types
from contextlib import contextmanager

# DeepSpeed imports its Muon modules to ask "is this Muon?" (ZeRO's support check, every gradient
# reduction); they compile their kernels at import (torch._inductor: 1-1.5 s of every rank's start).
MUON_OPTIMIZER = "deepspeed.runtime.zero.muon.muon_optimizer"
MUON_KERNELS = "deepspeed.runtime.zero.muon.original_muon"
# DeepSpeed's process group builds its CPU shared-memory all-reduce op at every start (deepspeed.comm.torch:
# TorchBackend), though only its tensor-parallel inference layers call it (inference_all_reduce).
DEEPSPEED_TORCH_BACKEND = "deepspeed.comm.torch"


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


def skip_inference_all_reduce_op() -> None:
    """Process groups start without DeepSpeed's CPU shared-memory all-reduce op. Building it was a JIT compile
    of C++ on the first start in every Python environment (about a minute, 2-6 min under load, with nothing
    printed), a compiler probe and 66 MB of /dev/shm in every rank at every start, for a call that training
    never makes: ZeRO and the engine reduce through torch.distributed. DeepSpeed's inference_all_reduce
    falls back to torch.distributed's all_reduce without the op (deepspeed/comm/torch.py)."""
    importlib.import_module(DEEPSPEED_TORCH_BACKEND).build_shm_op = _no_shm_op


def _no_shm_op() -> None:
    return None


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

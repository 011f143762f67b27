"""DeepSpeed, torch's optimizers and TensorBoard's writer without the parts a rank never runs, whose imports or builds
cost seconds at every start (the fine-tuning loops' optimizers too: launcher/downstream/training_loop.py)."""
from __future__ import annotations

import functools
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
# torch.optim imports all of Dynamo (sympy, its tracer: 1.2-1.3 CPU-s of every rank's start) at an optimizer's first
# add_param_group / zero_grad / state_dict and at every step, to mark graph breaks that only matter while compiling.
DYNAMO = "torch._dynamo"
# TensorBoard's file layer imports the AWS client for s3:// log directories (0.2-0.3 CPU-s of rank 0's start, measured:
# docs/training.md "Start-up and exit"); a run's are local (RUN_DIR/tb).
AWS_CLIENT = ("botocore", "boto3")


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


def summary_writer_class() -> type:
    """torch's SummaryWriter, TensorBoard's file layer imported without the AWS client (its S3 log directories only):
    boto3 stays importable for everything else (remote data imports it when it opens a store, before this)."""
    with unimportable(AWS_CLIENT[0]), unimportable(AWS_CLIENT[1]):
        from torch.utils.tensorboard import SummaryWriter
    return SummaryWriter


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


def optimizers_without_dynamo() -> None:
    """torch's optimizers stop importing Dynamo while nothing has imported it: the methods torch wraps in
    `torch._disable_dynamo` (add_param_group, zero_grad, state_dict, load_state_dict) and the steps it wraps in
    `_use_grad_for_differentiable` (a graph break on each side) call through until Dynamo is imported (a compiled
    model imports it first: launcher/train/engine.py), then do exactly what torch's do. Outside a compiled region
    `torch._dynamo.disable` is a plain call and a graph break nothing, so results are the same; a torch whose
    wrappers look otherwise is left as it is (tests/unit/test_lean_imports.py notices)."""
    import torch
    import torch.optim.optimizer as optim

    disable_code = torch._compile._disable_dynamo(lambda: None).__code__
    for method in vars(torch.optim.Optimizer).values():
        if getattr(method, "__code__", None) is disable_code:
            _call_through_until_dynamo(method)
    use_grad_code = optim._use_grad_for_differentiable(lambda: None).__code__
    for cls in vars(torch.optim).values():
        step = vars(cls).get("step") if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer) else None
        if getattr(step, "__code__", None) is use_grad_code and hasattr(step, "__wrapped__"):
            cls.step = _step_without_dynamo(step)


def _call_through_until_dynamo(wrapper) -> None:
    """A `torch._disable_dynamo` wrapper: torch keeps what it calls as the wrapped function's `__dynamo_disable`,
    made at the first call with `torch._dynamo.disable` (importing Dynamo); this stand-in is the plain function
    until Dynamo is imported, and then puts torch's own in its place."""
    cells = dict(zip(wrapper.__code__.co_freevars, (cell.cell_contents for cell in wrapper.__closure__)))
    fn, recursive = cells["fn"], cells["recursive"]
    if getattr(fn, "__dynamo_disable", None) is not None:  # called already: torch's own is in place
        return

    def call(*args, **kwargs):
        dynamo = sys.modules.get(DYNAMO)
        if dynamo is None:
            return fn(*args, **kwargs)
        disabled = dynamo.disable(fn, recursive, wrapping=False)
        setattr(fn, "__dynamo_disable", disabled)
        return disabled(*args, **kwargs)

    setattr(fn, "__dynamo_disable", call)


def _step_without_dynamo(use_grad_step):
    """An optimizer's step as `_use_grad_for_differentiable` runs it (grad mode as the `differentiable` default says,
    restored after) without its graph breaks until Dynamo is imported, then torch's own."""
    import torch

    step = use_grad_step.__wrapped__

    @functools.wraps(use_grad_step)
    def step_without_dynamo(self, *args, **kwargs):
        if DYNAMO in sys.modules:
            return use_grad_step(self, *args, **kwargs)
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return step(self, *args, **kwargs)

    return step_without_dynamo

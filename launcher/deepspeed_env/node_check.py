"""What a node's GPUs need from its software, checked before any rank starts (every node's pre-launch check,
launcher/launch/preflight.py) and as the first part of `roformer gpu-check`:

1. the torch wheel carries kernels for every GPU (torch.cuda.get_arch_list() against each GPU's compute
   capability, wheel_matrix.covers) and its CUDA runtime is one the driver runs (same major version or older);
2. DeepSpeed's FusedAdam is prebuilt, built in this environment's op cache, or buildable here (nvcc matching
   torch's CUDA): DeepSpeed's op builder answers without building. Where it is not, the job runs torch's AdamW
   through DeepSpeed (`torch_adam`, torch's fused implementation on CUDA) on every node: one optimizer, one
   checkpoint format.

`python -m launcher.deepspeed_env.node_check` prints this node's NodeFacts as JSON (what preflight asks each host
over ssh). A node without nvidia-smi is answered without importing torch. The decisions are pure functions of
NodeFacts, so tests inject the facts a CPU machine lacks.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, field

from launcher.common.errors import UserError
from launcher.deepspeed_env.optimizer_check import TORCH_ADAM_ENV

FUSED_ADAM_READY = ("prebuilt", "built", "buildable")


@dataclass(frozen=True)
class NodeFacts:
    """One node's GPUs and software, as `python -m launcher.deepspeed_env.node_check` reports them there."""

    host: str
    gpus: tuple[tuple[str, tuple[int, int]], ...] = ()
    """(product name, compute capability) of each GPU nvidia-smi lists; empty: no GPU."""
    driver_cuda: tuple[int, int] | None = None
    """The newest CUDA the driver runs (nvidia-smi's 'CUDA Version')."""
    torch_version: str = ""
    torch_cuda: str | None = None
    """torch.version.cuda ('12.6'); None for a CPU build."""
    arch_list: tuple[str, ...] = ()
    """torch.cuda.get_arch_list(): the architectures the wheel carries ('sm_70', ..., 'compute_90')."""
    fused_adam: str = "not asked"
    """'prebuilt', 'built', 'buildable', or why not ('no nvcc: ...'); 'not asked' without GPUs."""
    accelerator: str = ""
    """DS_ACCELERATOR on that node ('' = DeepSpeed detects it)."""

    @classmethod
    def from_dict(cls, data: dict) -> "NodeFacts":
        return cls(host=data["host"], gpus=tuple((name, tuple(cc)) for name, cc in data.get("gpus", ())),
                   driver_cuda=tuple(data["driver_cuda"]) if data.get("driver_cuda") else None,
                   torch_version=data.get("torch_version", ""), torch_cuda=data.get("torch_cuda"),
                   arch_list=tuple(data.get("arch_list", ())), fused_adam=data.get("fused_adam", "not asked"),
                   accelerator=data.get("accelerator", ""))

    @property
    def uses_gpus(self) -> bool:
        return bool(self.gpus) and self.accelerator in ("", "cuda")


def gather_facts(host: str = "this machine") -> NodeFacts:
    """This node's facts (see NodeFacts); torch and DeepSpeed are imported only where nvidia-smi sees a GPU."""
    from launcher.deepspeed_env.wheel_matrix import torch_variant

    seen = torch_variant().query_gpus()
    accelerator = os.environ.get("DS_ACCELERATOR", "")
    if not seen.names or accelerator not in ("", "cuda"):
        return NodeFacts(host, tuple(zip(seen.names, seen.capabilities)), seen.driver_cuda, accelerator=accelerator)
    import torch

    return NodeFacts(host, tuple(zip(seen.names, seen.capabilities)), seen.driver_cuda, torch.__version__,
                     torch.version.cuda, tuple(torch.cuda.get_arch_list()), fused_adam_status(), accelerator)


def fused_adam_status() -> str:
    """DeepSpeed's own answer, without building: its prebuilt ops, this environment's op cache, or whether its
    builder finds an nvcc matching torch's CUDA (deepspeed/ops/op_builder/builder.py assert_no_cuda_mismatch)."""
    from deepspeed.git_version_info import installed_ops
    from deepspeed.ops.op_builder import FusedAdamBuilder

    from launcher.deepspeed_env.ops_cache import extensions_dir

    if installed_ops.get(FusedAdamBuilder.NAME):
        return "prebuilt"
    if any((extensions_dir() / FusedAdamBuilder.NAME).glob(f"{FusedAdamBuilder.NAME}*.so")):
        return "built"
    builder = FusedAdamBuilder()
    if not builder.is_compatible(verbose=False):
        return f"not compatible: {builder.error_log or 'DeepSpeed says so'}"
    from deepspeed.ops.op_builder.builder import assert_no_cuda_mismatch

    try:
        assert_no_cuda_mismatch(builder.name)
    except Exception as err:  # MissingCUDAException (no CUDA_HOME / nvcc), CUDAMismatchException
        return f"no nvcc matching torch's CUDA {_cuda_of()}: {str(err).strip().splitlines()[0]}"
    return "buildable"


def _cuda_of() -> str:
    import torch

    return torch.version.cuda or "none"


def wheel_refusal(facts: NodeFacts) -> str | None:
    """One line naming the node, the GPU, the wheel and the fix, when the wheel cannot run there; else None."""
    if not facts.uses_gpus:
        return None
    from launcher.deepspeed_env.wheel_matrix import covers, fix_hint

    capabilities = [cc for _, cc in facts.gpus]
    fix = fix_hint(capabilities, facts.driver_cuda)
    wheel = f"torch {facts.torch_version or '(none)'}"
    if facts.torch_cuda is None:
        return (f"node {facts.host}: {wheel} is not a CUDA build, its GPUs ({facts.gpus[0][0]}) would sit idle; "
                f"fix: TORCH_VARIANT=cuda make setup there")
    for index, (name, cc) in enumerate(facts.gpus):
        if not covers(facts.arch_list, cc):
            return (f"node {facts.host}: GPU {index} {name} (sm_{cc[0]}{cc[1]}) has no kernels in {wheel} (built for "
                    f"{', '.join(facts.arch_list) or 'no architecture'}); fix: {fix}")
    runtime = tuple(int(part) for part in facts.torch_cuda.split(".")[:2])
    if facts.driver_cuda is not None and runtime[0] > facts.driver_cuda[0]:
        return (f"node {facts.host}: {wheel} (CUDA {facts.torch_cuda}) needs a CUDA {runtime[0]} driver; the driver of "
                f"its {facts.gpus[0][0]} runs CUDA {facts.driver_cuda[0]}.{facts.driver_cuda[1]}; fix: {fix}")
    return None


@dataclass(frozen=True)
class OptimizerChoice:
    """The optimizer every GPU node of the job runs, and one line per node saying which and why."""

    name: str
    """'FusedAdam', "torch's fused AdamW (torch_adam)" or the config's own (as named there)."""
    torch_adam: bool
    """The ranks set optimizer.params.torch_adam (TORCH_ADAM_ENV) although the JSON does not."""
    lines: list[str] = field(default_factory=list)


def choose_optimizer(nodes: list[NodeFacts], optimizer: dict | None, source: str) -> OptimizerChoice:
    """FusedAdam where every GPU node has it ready, else torch's fused AdamW on every node; a config asking for
    FusedAdam explicitly (`torch_adam: false`) that some node cannot build is refused in one line."""
    section = optimizer or {}
    params = section.get("params") or {}
    kind = str(section.get("type", "")).lower()
    gpu_nodes = [node for node in nodes if node.uses_gpus]
    if kind not in ("adam", "adamw") or not gpu_nodes:
        return OptimizerChoice(str(section.get("type", "none")), False)
    if params.get("torch_adam"):
        return OptimizerChoice("torch AdamW (torch_adam in the DeepSpeed JSON)", False,
                               [f"node {n.host}: optimizer torch AdamW (torch_adam in {source})" for n in gpu_nodes])
    lacking = [node for node in gpu_nodes if node.fused_adam not in FUSED_ADAM_READY]
    if lacking and "torch_adam" in params:
        node = lacking[0]
        raise UserError(f"{source}: optimizer.params.torch_adam: false asks for DeepSpeed's FusedAdam, which node "
                        f"{node.host} cannot build ({node.fused_adam}); install the CUDA toolkit (nvcc) there, or "
                        f"remove torch_adam to run torch's fused AdamW")
    if not lacking:
        return OptimizerChoice("FusedAdam", False, [f"node {n.host}: optimizer DeepSpeed FusedAdam ({n.fused_adam})"
                                                    for n in gpu_nodes])
    fallback = "torch's fused AdamW (torch_adam)"
    lines = [f"node {n.host}: optimizer {fallback}: "
             + (f"DeepSpeed's FusedAdam cannot be built here ({n.fused_adam})" if n in lacking
                else f"FusedAdam is {n.fused_adam} here, but node {lacking[0].host} cannot build it and every node "
                     f"runs one optimizer") for n in gpu_nodes]
    return OptimizerChoice(fallback, True, lines)


def planned_optimizer(ds_config: dict) -> str:
    """What each GPU node will run, as `roformer plan` and `pretrain --dry-run` say it (choose_optimizer decides on
    every node before launch)."""
    section = ds_config.get("optimizer") or {}
    params = section.get("params") or {}
    if str(section.get("type", "")).lower() not in ("adam", "adamw"):
        return f"{section.get('type', 'none')} (the DeepSpeed JSON's)"
    if params.get("torch_adam"):
        return "torch AdamW on every node (torch_adam in the DeepSpeed JSON)"
    if (ds_config.get("zero_optimization") or {}).get("offload_optimizer", {}).get("device") in ("cpu", "nvme"):
        return "DeepSpeedCPUAdam on every node (optimizer offload)"
    if "torch_adam" in params:
        return "DeepSpeed FusedAdam on every node (torch_adam: false: a node that cannot build it is refused)"
    return ("DeepSpeed FusedAdam on every GPU node where it is prebuilt, built or buildable (nvcc); if any node "
            "cannot build it, torch's fused AdamW (torch_adam) on every node: checked on each node before launch")


if __name__ == "__main__":
    import socket

    json.dump(asdict(gather_facts(sys.argv[1] if len(sys.argv) > 1 else socket.gethostname())), sys.stdout)
    print()

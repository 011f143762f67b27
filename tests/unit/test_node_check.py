"""Each node's GPUs against its torch wheel, and FusedAdam or torch's AdamW (launcher/deepspeed_env/node_check.py,
issue 60 items 2 and 3), with the facts this CPU machine lacks injected: GPUs, a CUDA torch's arch list, DeepSpeed's
op builder's answer. The pre-launch check runs on a real launch plan of the reference cluster (hostfile, 2 x 4)."""
from __future__ import annotations

from argparse import Namespace

import pytest
import torch

from launcher.common.errors import UserError
from launcher.deepspeed_env.optimizer_check import TORCH_ADAM_ENV, node_optimizer
from launcher.deepspeed_env.node_check import NodeFacts, choose_optimizer, planned_optimizer, wheel_refusal
from tests.support.helpers import REPO

V100 = ("Tesla V100-SXM2-16GB", (7, 0))
A100 = ("NVIDIA A100-SXM4-80GB", (8, 0))
CU126_ARCHS = ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90")
CU130_ARCHS = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120")
FIX = "TORCH_CUDA_TAG=cu126 make setup"


def node(host="node1", gpus=(V100,) * 4, driver=(12, 8), wheel="cu126", fused_adam="buildable") -> NodeFacts:
    archs, cuda = (CU126_ARCHS, "12.6") if wheel == "cu126" else (CU130_ARCHS, "13.0")
    return NodeFacts(host, gpus, driver, f"2.13.0+{wheel}", cuda, archs, fused_adam)


def test_a_wheel_without_the_gpus_architecture_is_refused_naming_node_gpu_wheel_and_fix():
    assert wheel_refusal(node()) is None
    assert wheel_refusal(node(gpus=(A100,), wheel="cu130", driver=(13, 0))) is None
    assert wheel_refusal(node(gpus=(("NVIDIA L4", (8, 9)),))) is None  # sm_86 kernels run on 8.9
    line = wheel_refusal(node("node2", driver=(13, 0), wheel="cu130"))
    assert line == ("node node2: GPU 0 Tesla V100-SXM2-16GB (sm_70) has no kernels in torch 2.13.0+cu130 (built for "
                    f"{', '.join(CU130_ARCHS)}); fix: {FIX}")
    mixed = wheel_refusal(node(gpus=(A100, V100), driver=(13, 0), wheel="cu130"))
    assert "GPU 1 Tesla V100-SXM2-16GB (sm_70)" in mixed and mixed.endswith(FIX)


def test_a_cuda_runtime_newer_than_the_driver_is_refused():
    line = wheel_refusal(node(gpus=(A100,), driver=(12, 8), wheel="cu130"))
    assert line == ("node node1: torch 2.13.0+cu130 (CUDA 13.0) needs a CUDA 13 driver; the driver of its "
                    f"NVIDIA A100-SXM4-80GB runs CUDA 12.8; fix: {FIX}")
    cpu_torch = NodeFacts("node1", (V100,), (12, 8), "2.13.0+cpu", None, (), "not asked")
    assert "is not a CUDA build" in wheel_refusal(cpu_torch)
    assert wheel_refusal(NodeFacts("node1", (V100,), (12, 8), accelerator="cpu")) is None  # CPU ranks by choice
    assert wheel_refusal(NodeFacts("login")) is None  # no GPU


GPU_ADAMW = {"type": "AdamW", "params": {"betas": [0.9, 0.999], "eps": 1e-6, "weight_decay": 0.01}}


def test_a_node_without_nvcc_runs_torchs_fused_adamw_and_says_so():
    ready = choose_optimizer([node("node1"), node("node2", fused_adam="built")], GPU_ADAMW, "v100.json")
    assert (ready.name, ready.torch_adam) == ("FusedAdam", False)
    assert ready.lines == ["node node1: optimizer DeepSpeed FusedAdam (buildable)",
                           "node node2: optimizer DeepSpeed FusedAdam (built)"]
    no_nvcc = "no nvcc matching torch's CUDA 12.6: CUDA_HOME does not exist, unable to compile CUDA op(s)"
    choice = choose_optimizer([node("node1"), node("node2", fused_adam=no_nvcc)], GPU_ADAMW, "v100.json")
    assert choice.torch_adam and choice.name == "torch's fused AdamW (torch_adam)"
    assert choice.lines == [
        "node node1: optimizer torch's fused AdamW (torch_adam): FusedAdam is buildable here, but node node2 cannot "
        "build it and every node runs one optimizer",
        f"node node2: optimizer torch's fused AdamW (torch_adam): DeepSpeed's FusedAdam cannot be built here ({no_nvcc})"]
    explicit = {**GPU_ADAMW, "params": {**GPU_ADAMW["params"], "torch_adam": False}}
    with pytest.raises(UserError, match=r"^v100.json: optimizer.params.torch_adam: false asks for DeepSpeed's FusedAdam, "
                                        r"which node node2 cannot build \(no nvcc"):
        choose_optimizer([node("node1"), node("node2", fused_adam=no_nvcc)], explicit, "v100.json")


def test_the_plan_names_the_optimizer_of_each_shipped_json():
    import json

    said = {path.name: planned_optimizer(json.loads(path.read_text())) for path in (REPO / "ds_configs").glob("*.json")}
    assert said["cpu_fp32_zero2.json"] == "torch AdamW on every node (torch_adam in the DeepSpeed JSON)"
    assert said["v100_fp16_zero2_offload.json"] == "DeepSpeedCPUAdam on every node (optimizer offload)"
    assert said["v100_fp16_zero2.json"].startswith("DeepSpeed FusedAdam on every GPU node where it is prebuilt, built "
                                                   "or buildable (nvcc); if any node cannot build it, torch's fused AdamW")


def test_the_rank_config_gets_torch_adam_fused_on_cuda_only_when_the_check_said_so():
    config = {"optimizer": {"type": "AdamW", "params": {"eps": 1e-6}}}
    assert node_optimizer(dict(config), "cuda", {}) == config
    cuda = node_optimizer({"optimizer": {"type": "AdamW", "params": {"eps": 1e-6}}}, "cuda", {TORCH_ADAM_ENV: "1"})
    assert cuda["optimizer"]["params"] == {"eps": 1e-6, "torch_adam": True, "fused": True}
    cpu = node_optimizer({"optimizer": {"type": "AdamW", "params": {}}}, "cpu", {TORCH_ADAM_ENV: "1"})
    assert cpu["optimizer"]["params"] == {"torch_adam": True}
    # What DeepSpeed builds from those params (its own code: the torch_adam branch needs no engine state).
    from deepspeed.runtime.engine import DeepSpeedEngine

    params = {**cuda["optimizer"]["params"], "lr": 1e-3, "betas": (0.9, 0.999), "weight_decay": 0.01}
    cls, extra = DeepSpeedEngine.get_optimizer_configuration(None, params, True)
    built = cls([torch.nn.Parameter(torch.zeros(4))], **params, **extra)
    assert type(built) is torch.optim.AdamW and built.defaults["fused"] is True


def test_cpu_ranks_are_not_asked(monkeypatch):
    """A job on CPU ranks (DS_ACCELERATOR=cpu, as every test launch) asks no node: nothing added, nothing run."""
    from launcher.launch.launch_plan import build_plan
    from launcher.launch.preflight import check_nodes

    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    args = Namespace(hostfile=str(REPO / "hostfile"), include="", exclude="", num_nodes=-1, num_gpus=-1,
                     master_addr="", master_port=29500, launcher="pdsh", launcher_args="", force_multi=False,
                     bind_cores_to_rank=False, bind_core_list=None, config=str(REPO / "configs" / "demo_cpu.yaml"),
                     run_dir="/nonexistent/run", overrides=[], entry_module="launcher.train.rank_entry")
    plan = build_plan(args)
    assert plan.env["DS_ACCELERATOR"] == "cpu"
    assert check_nodes(plan, ask=lambda host: pytest.fail(f"asked {host}")) == {}


def _fused_adam_kernel_step(p, g, m, v, step, lr, beta1, beta2, eps, decay):
    """DeepSpeed's FusedAdam update, ADAM_MODE_1 (adam_w_mode, decoupled decay), as
    deepspeed/ops/csrc/adam/multi_tensor_adam.cu computes it per element (bias_correction on)."""
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    denom = (v / (1 - beta2 ** step)).sqrt() + eps
    return p - lr * ((m / (1 - beta1 ** step)) / denom + decay * p), m, v


@pytest.mark.parametrize("implementation", [{"foreach": False}, {"fused": True}])
def test_torch_adamw_takes_fused_adams_steps(implementation):
    """Three steps of torch.optim.AdamW (as DeepSpeed builds it under torch_adam: its extra parameters passed
    through) against FusedAdam's kernel arithmetic, fp32 on CPU, the GPU JSONs' betas, eps and decay."""
    generator = torch.Generator().manual_seed(0)
    start = torch.randn(4096, generator=generator)
    grads = [torch.randn(4096, generator=generator) * scale for scale in (1.0, 1e-3, 30.0)]
    lr, (beta1, beta2), eps, decay = 1e-3, GPU_ADAMW["params"]["betas"], GPU_ADAMW["params"]["eps"], 0.01
    param = torch.nn.Parameter(start.clone())
    optimizer = torch.optim.AdamW([param], lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=decay, **implementation)
    p, m, v = start.clone(), torch.zeros_like(start), torch.zeros_like(start)
    for step, grad in enumerate(grads, start=1):
        param.grad = grad.clone()
        optimizer.step()
        p, m, v = _fused_adam_kernel_step(p, grad, m, v, step, lr, beta1, beta2, eps, decay)
        assert (param.detach() - p).abs().max().item() <= 1e-6 * max(1.0, p.abs().max().item())
    assert (param.detach() - start).abs().max().item() > 1e-3  # the steps moved the weights


def test_the_pre_launch_check_of_the_reference_cluster(monkeypatch, capsys):
    """check_nodes on a real launch plan (the reference hostfile, V100 fp16 ZeRO-2): a cu130 wheel on node2 stops
    the launch before any rank in one line; node2 without nvcc switches every rank to torch's fused AdamW."""
    from launcher.launch.launch_plan import build_plan
    from launcher.launch.preflight import check_nodes

    args = Namespace(hostfile=str(REPO / "hostfile"), include="", exclude="", num_nodes=-1, num_gpus=-1,
                     master_addr="", master_port=29500, launcher="pdsh", launcher_args="", force_multi=False,
                     bind_cores_to_rank=False, bind_core_list=None, config=str(REPO / "configs" / "reference_v100.yaml"),
                     run_dir="/nonexistent/run", overrides=[], entry_module="launcher.train.rank_entry")
    environ = {key: value for key, value in __import__("os").environ.items() if key != "DS_ACCELERATOR"}
    plan = build_plan(args, environ=environ)
    facts = {"node1": node("node1"), "node2": node("node2", driver=(13, 0), wheel="cu130")}
    with pytest.raises(UserError, match=rf"^node node2: GPU 0 Tesla V100-SXM2-16GB \(sm_70\) .*; fix: {FIX}$"):
        check_nodes(plan, ask=facts.get)
    facts["node2"] = node("node2", fused_adam="no nvcc matching torch's CUDA 12.6: CUDA_HOME does not exist")
    assert check_nodes(plan, ask=facts.get) == {TORCH_ADAM_ENV: "1"}
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out] == ["roformer pretrain"] * 2 and "node node2" in out[1]
    assert TORCH_ADAM_ENV.startswith("ROFORMER_")  # forwarded to every node (launcher/launch/env_forwarding.py)

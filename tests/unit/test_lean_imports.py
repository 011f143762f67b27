"""A rank imports and builds DeepSpeed without the parts it never runs (launcher/deepspeed_env/lean_imports.py): not MLflow,
not the Muon modules with their compiled kernels (a run that uses them still gets the real ones), not the CPU
shared-memory all-reduce op (its process group: launcher/deepspeed_env/process_group.py), not Dynamo for an
optimizer while nothing is compiled (the same steps as torch's; torch's own once Dynamo is imported), not the AWS client
for TensorBoard's writer (its S3 log directories)."""
import json
import subprocess
import sys

from tests.support.helpers import REPO, free_port, rank_env

# One ZeRO-2 step of a tiny model in a 1-rank process group, then what it imported. torch's AdamW, as in
# ds_configs/cpu_*.json: DeepSpeed's FusedAdam would be a JIT build of its own (about a minute in CI).
ENGINE_STEP = """
import json, sys
from launcher.deepspeed_env.lean_imports import answer_not_muon, import_deepspeed, optimizers_without_dynamo
import_deepspeed()
import deepspeed, torch
optimizer = sys.argv[1]
answer_not_muon(optimizer)
optimizers_without_dynamo()
from launcher.deepspeed_env.process_group import init_distributed
init_distributed("gloo", auto_mpi_discovery=False)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
config = {"train_micro_batch_size_per_gpu": 2,
          "optimizer": {"type": optimizer, "params": {"lr": 1e-3, "torch_adam": True}},
          "zero_optimization": {"stage": 2}}
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
loss = engine(torch.randn(2, 8)).pow(2).mean()
engine.backward(loss)
engine.step()
names = ("mlflow", "torch._inductor.compile_fx", "deepspeed.runtime.zero.muon.original_muon", "torch._dynamo")
imported = {name: name in sys.modules and sys.modules[name] is not None and hasattr(sys.modules[name], "__file__")
            for name in names}
print(json.dumps({**imported, "shm_comm_op": deepspeed.comm.comm.cdb.shm_comm_op is not None}))
"""


def _imported_after_one_step(optimizer: str, ops_dir) -> dict:
    env = rank_env(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                   TORCH_EXTENSIONS_DIR=str(ops_dir))
    out = subprocess.run([sys.executable, "-c", ENGINE_STEP, optimizer], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_an_adamw_rank_trains_without_mlflow_the_compiled_muon_modules_dynamo_or_the_shm_all_reduce_op(tmp_path):
    # A fresh op cache: DeepSpeed's process group used to compile its CPU all-reduce op into it (about a minute).
    ops_dir = tmp_path / "torch_extensions"
    assert _imported_after_one_step("AdamW", ops_dir) == {
        "mlflow": False, "torch._inductor.compile_fx": False, "deepspeed.runtime.zero.muon.original_muon": False,
        "torch._dynamo": False, "shm_comm_op": False}
    assert not ops_dir.exists() or not any(ops_dir.iterdir())


def test_mlflow_is_importable_after_deepspeed_and_muon_is_left_to_a_muon_run(monkeypatch):
    from launcher.deepspeed_env.lean_imports import MUON_KERNELS, MUON_OPTIMIZER, answer_not_muon, import_deepspeed

    import_deepspeed()
    assert sys.modules.get("mlflow", "absent") is not None  # the block is lifted: `import mlflow` can work
    for name in (MUON_KERNELS, MUON_OPTIMIZER):
        monkeypatch.delitem(sys.modules, name, raising=False)
    answer_not_muon("Muon")
    assert MUON_KERNELS not in sys.modules and MUON_OPTIMIZER not in sys.modules
    answer_not_muon("adamw")
    assert not hasattr(sys.modules[MUON_KERNELS], "__file__")  # the stand-in, not DeepSpeed's module
    for name in (MUON_KERNELS, MUON_OPTIMIZER):
        monkeypatch.delitem(sys.modules, name)


# Three steps of AdamW and of SGD with momentum (zero_grad, state_dict and load_state_dict between them), with or without
# optimizers_without_dynamo; then, with it, Dynamo imported: the next step and zero_grad are torch's own again.
OPTIMIZER_STEPS = """
import hashlib, json, sys
import torch
if sys.argv[1] == "without_dynamo":
    from launcher.deepspeed_env.lean_imports import optimizers_without_dynamo
    optimizers_without_dynamo()
digests = {}
for name, make in (("AdamW", lambda p: torch.optim.AdamW(p, lr=0.1, weight_decay=0.01)),
                   ("SGD", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = make(model.parameters())
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(5, 4)).pow(2).sum().backward()
        optimizer.step()
        optimizer.load_state_dict(optimizer.state_dict())
    digests[name] = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
report = {"digests": digests, "dynamo": "torch._dynamo" in sys.modules, "grad_after_step": torch.is_grad_enabled()}
import torch._dynamo
breaks = []
torch._dynamo.graph_break = lambda: breaks.append(1)
optimizer.zero_grad()
model(torch.randn(5, 4)).pow(2).sum().backward()
optimizer.step()
zero_grad = torch.optim.Optimizer.zero_grad.__wrapped__
report["graph_breaks_once_imported"] = len(breaks)
report["zero_grad_disabled_by_dynamo"] = getattr(zero_grad, "__dynamo_disable").__module__.startswith("torch._dynamo")
print(json.dumps(report))
"""


def _optimizer_steps(variant: str) -> dict:
    out = subprocess.run([sys.executable, "-c", OPTIMIZER_STEPS, variant], cwd=REPO, env=rank_env(), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_optimizers_step_as_torchs_without_importing_dynamo_and_hand_over_to_it_once_imported():
    torchs, ours = _optimizer_steps("torch"), _optimizer_steps("without_dynamo")
    assert ours["digests"] == torchs["digests"]  # the same weights after each optimizer's three steps
    assert torchs["dynamo"] and not ours["dynamo"]  # torch's own steps import Dynamo, ours did not
    assert ours["grad_after_step"]
    # Imported, Dynamo is torch's again: a graph break on each side of the step, zero_grad through its disable.
    assert ours["graph_breaks_once_imported"] == torchs["graph_breaks_once_imported"] == 2
    assert ours["zero_grad_disabled_by_dynamo"] and torchs["zero_grad_disabled_by_dynamo"]


# Rank 0's TensorBoard sink in a fresh process: its scalars, and whether the AWS client was imported for them.
TENSORBOARD_SINK = """
import json, sys
from pathlib import Path
from launcher.tracking.tensorboard import TensorBoardSink
sink = TensorBoardSink(Path(sys.argv[1]), start_step=0, log_every=1, total_steps=2)
sink.record({"kind": "train", "step": 1, "loss": 2.5})
sink.record({"kind": "valid", "step": 2, "loss": 2.25, "mlm_accuracy": 0.5})
sink.close()
aws = {name: name in sys.modules for name in ("boto3", "botocore")}
import boto3  # still importable by what needs it (remote data)
print(json.dumps(aws))
"""


def test_tensorboard_scalars_are_written_without_importing_the_aws_client(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = subprocess.run([sys.executable, "-c", TENSORBOARD_SINK, str(tmp_path / "tb")], cwd=REPO, env=rank_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"boto3": False, "botocore": False}
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(1, 2.5)]
    assert [(e.step, e.value) for e in events.Scalars("valid/loss")] == [(2, 2.25)]

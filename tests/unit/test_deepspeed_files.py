"""DeepSpeed's checkpoint files read with weights_only=True (launcher/checkpoint/deepspeed_files.py): the ZeRO stage Enum
in either form Python pickles it in (Python 3.11.2, Debian 12's, writes `getattr(ZeroStageEnum, name)`: universal
conversions failed to resume there), no other getattr, and a ZeRO-0 model state file (export's unpartitioned path)."""
import json
import pickle
import subprocess
import sys

import pytest
import torch
from deepspeed.runtime.fp16.loss_scaler import LossScaler
from deepspeed.runtime.zero.config import ZeroStageEnum

from launcher.checkpoint.deepspeed_files import load_deepspeed_file
from tests.support.helpers import REPO, free_port, rank_env


class _PickledBy:
    """Pickles as `function(*args)`: how a given Python version writes an object, on any version."""

    def __init__(self, function, *args):
        self.function, self.args = function, args

    def __reduce__(self):
        return self.function, self.args


def test_the_zero_stage_enum_loads_whether_pickled_by_name_or_by_value(tmp_path):
    by_name, by_value = tmp_path / "by_name.pt", tmp_path / "by_value.pt"
    torch.save({"zero_stage": _PickledBy(getattr, ZeroStageEnum, "gradients"), "loss_scaler": LossScaler(1.0)},
               by_name)  # as Python 3.11.2 writes DeepSpeed's optimizer state
    torch.save({"zero_stage": _PickledBy(ZeroStageEnum, 2), "loss_scaler": LossScaler(1.0)}, by_value)
    with pytest.raises(pickle.UnpicklingError, match="getattr"):  # what torch's allowlist alone said
        with torch.serialization.safe_globals([LossScaler, ZeroStageEnum]):
            torch.load(by_name, weights_only=True)
    for path in (by_name, by_value):
        state = load_deepspeed_file(path)
        assert state["zero_stage"] is ZeroStageEnum.gradients
        assert isinstance(state["loss_scaler"], LossScaler) and state["loss_scaler"].cur_scale == 1.0


@pytest.mark.parametrize("owner, name", [(LossScaler, "__init__"), (ZeroStageEnum, "__init_subclass__"),
                                         (ZeroStageEnum, "_missing_")])
def test_any_other_getattr_in_a_checkpoint_is_refused(tmp_path, owner, name):
    path = tmp_path / "state.pt"
    torch.save({"value": _PickledBy(getattr, owner, name)}, path)
    with pytest.raises(pickle.UnpicklingError, match="only name an Enum member"):
        load_deepspeed_file(path)


# A 1-rank ZeRO-0 fp32 engine's checkpoint: its model state file holds the optimizer's state beside the weights.
ZERO0_CHECKPOINT = """
import json, sys
import deepspeed, torch
from launcher.deepspeed_env.process_group import init_distributed
init_distributed("gloo", auto_mpi_discovery=False)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
config = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
          "zero_optimization": {"stage": 0}}
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
engine.backward(engine(torch.randn(2, 8)).pow(2).mean())
engine.step()
engine.save_checkpoint(sys.argv[1], tag="global_step1")
print(json.dumps({k: v.tolist() for k, v in engine.module.state_dict().items()}))
"""


def test_a_zero_0_checkpoint_gives_its_weights(tmp_path):
    env = rank_env(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    out = subprocess.run([sys.executable, "-c", ZERO0_CHECKPOINT, str(tmp_path)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    trained = json.loads(out.stdout.strip().splitlines()[-1])
    state = load_deepspeed_file(tmp_path / "global_step1" / "mp_rank_00_model_states.pt")
    assert "optimizer" in state  # ZeRO-0 keeps the optimizer's state in this file
    assert {k: v.tolist() for k, v in state["module"].items()} == trained

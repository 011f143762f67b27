"""Every shipped DeepSpeed JSON, resolved for real stages, parses with DeepSpeed's own DeepSpeedConfig.

DeepSpeedConfig reads the data-parallel size from an mpu once torch.distributed is up, so the parsing
runs in one child process with a single-rank gloo group (keeps this test process free of a dist group).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from launcher.batching import deepspeed_top_level_keys, load_ds_json, resolve_ds_config, resolve_stages
from launcher.config import load_run_config
from tests.conftest_training import REPO, run_config_dict, write_yaml

SHIPPED = sorted(p.name for p in (REPO / "ds_configs").glob("*.json"))
WORLD_SIZES = (1, 2, 8)

PARSER = r"""
import json, os, socket, sys
import deepspeed, deepspeed.comm as dist
from deepspeed.runtime.config import DeepSpeedConfig

class DataParallelOnly:  # the mpu-shaped object DeepSpeedConfig asks for the data-parallel size
    def __init__(self, n): self.n = n
    def get_data_parallel_world_size(self): return self.n

s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
out = {}
for key, (config, world) in json.load(sys.stdin).items():
    try:
        c = DeepSpeedConfig(config, mpu=DataParallelOnly(world))
        out[key] = {"ok": True, "train_batch_size": c.train_batch_size, "micro": c.train_micro_batch_size_per_gpu,
                    "gas": c.gradient_accumulation_steps, "zero_stage": c.zero_optimization_stage,
                    "fp16": bool(c.float16_config.enabled), "bf16": bool(c.bfloat16_config.enabled), "clip": c.gradient_clipping,
                    "offload": c.zero_config.offload_optimizer is not None, "world": c.world_size,
                    "optimizer": c.optimizer_name, "load_universal": c.load_universal_checkpoint}
    except Exception as err:
        out[key] = {"ok": False, "error": f"{type(err).__name__}: {err}"}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def parsed(tmp_path_factory):
    cases = {}
    for name in SHIPPED:
        path = write_yaml(tmp_path_factory.mktemp("cfg") / "run.yaml",
                          run_config_dict(ds_config=name, schedule_file=REPO / "launcher/schedules/table4_v100.yaml",
                                          schedule={"max_tokens_per_micro_batch": 8192}))
        cfg = load_run_config(path)
        for world in WORLD_SIZES:
            for stage in resolve_stages(cfg, world)[:2]:  # two stages: a batch change, cheap
                cases[f"{name}|{world}|{stage.index}"] = (resolve_ds_config(cfg, stage, world, world == 2), world)
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", PARSER], input=json.dumps(cases), capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cases, json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_shipped_config_parses_for_every_stage_and_world_size(parsed):
    cases, results = parsed
    assert len(SHIPPED) >= 6 and set(results) == set(cases)
    for key, result in results.items():
        assert result["ok"], f"{key}: {result.get('error')}"
        config, world = cases[key]
        assert result["world"] == world
        assert result["train_batch_size"] == result["micro"] * result["gas"] * world == config["train_batch_size"]
        assert result["load_universal"] == (world == 2)


def test_reference_configs_are_what_the_issue_asks(parsed):
    _, results = parsed
    by_name = {key.split("|")[0]: r for key, r in results.items()}
    expected = {"v100_fp16_zero1.json": (1, True, False), "v100_fp16_zero2.json": (2, True, False),
                "v100_fp16_zero3.json": (3, True, False), "v100_fp16_zero2_offload.json": (2, True, True),
                "cpu_fp32_zero2.json": (2, False, False), "cpu_bf16_zero2.json": (2, False, False)}
    for name, (stage, fp16, offload) in expected.items():
        r = by_name[name]
        assert (r["zero_stage"], r["fp16"], r["offload"]) == (stage, fp16, offload), name
        assert r["optimizer"] == "adamw" and r["clip"] == 1.0, name
    assert by_name["cpu_bf16_zero2.json"]["bf16"] and not by_name["cpu_fp32_zero2.json"]["bf16"]


def test_cpu_configs_use_torch_adam_and_gpu_configs_do_not():
    for name in SHIPPED:
        params = load_ds_json(REPO / "ds_configs" / name)["optimizer"]["params"]
        assert params.get("torch_adam", False) == name.startswith("cpu_"), name


def test_known_key_list_comes_from_deepspeed():
    keys = deepspeed_top_level_keys()
    for key in ("zero_optimization", "fp16", "bf16", "gradient_clipping", "optimizer", "tensorboard", "checkpoint"):
        assert key in keys
    assert "zero_optimisation" not in keys and "gradient_clip" not in keys

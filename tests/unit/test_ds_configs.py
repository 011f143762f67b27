"""Every shipped DeepSpeed JSON, resolved for real stages, parses with DeepSpeed's own DeepSpeedConfig.

DeepSpeedConfig asks deepspeed.comm for the rank and then an mpu for the data-parallel size; we give
it rank 0 and an mpu of the wanted size instead of starting a process group (which on CPU would also
JIT-compile DeepSpeed's shm-comm op), so the real parsing and batch checks run for any world size.
"""
from __future__ import annotations

import pytest

from launcher.config.deepspeed_json import (
    DeepSpeedJson,
    deepspeed_top_level_keys,
    load_ds_json,
)
from launcher.config.run_config import load_run_config
from launcher.config.stages import resolve_stages
from launcher.resolved.stage_configs import resolve_ds_config
from tests.support.helpers import REPO, run_config_dict, write_yaml

SHIPPED = sorted(p.name for p in (REPO / "ds_configs").glob("*.json"))
WORLD_SIZES = (1, 2, 8)


class DataParallelOnly:
    """The mpu-shaped object DeepSpeedConfig asks for the data-parallel size."""

    def __init__(self, size: int):
        self.size = size

    def get_data_parallel_world_size(self) -> int:
        return self.size


@pytest.fixture(scope="module")
def parsed(tmp_path_factory):
    import deepspeed.comm
    from deepspeed.runtime.config import DeepSpeedConfig

    cases, results = {}, {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(deepspeed.comm, "get_rank", lambda *args, **kwargs: 0)
        for name in SHIPPED:
            path = write_yaml(tmp_path_factory.mktemp("cfg") / "run.yaml",
                              run_config_dict(ds_config=name,
                                              schedule_file=REPO / "launcher/schedules/table4_v100.yaml",
                                              schedule={"max_tokens_per_micro_batch": 8192}))
            cfg = load_run_config(path)
            ds_json = DeepSpeedJson.of(cfg)
            for world in WORLD_SIZES:
                for stage in resolve_stages(cfg, world)[:2]:  # two stages: a batch/length change
                    key = f"{name}|{world}|{stage.index}"
                    config = resolve_ds_config(cfg, stage, world, ds_json, load_universal=world == 2)
                    cases[key] = (config, world)
                    try:
                        c = DeepSpeedConfig(config, mpu=DataParallelOnly(world))
                    except Exception as err:  # reported per case by the test below
                        results[key] = {"ok": False, "error": f"{type(err).__name__}: {err}"}
                        continue
                    results[key] = {
                        "ok": True, "train_batch_size": c.train_batch_size, "micro": c.train_micro_batch_size_per_gpu,
                        "gas": c.gradient_accumulation_steps, "zero_stage": c.zero_optimization_stage,
                        "fp16": bool(c.float16_config.enabled), "bf16": bool(c.bfloat16_config.enabled),
                        "clip": c.gradient_clipping, "offload": c.zero_config.offload_optimizer is not None,
                        "world": c.world_size, "optimizer": c.optimizer_name,
                        "load_universal": c.load_universal_checkpoint}
    return cases, results


def test_deepspeed_rejects_a_wrong_batch_product():
    import deepspeed.comm
    from deepspeed.runtime.config import DeepSpeedConfig

    config = load_ds_json(REPO / "ds_configs/cpu_fp32_zero2.json")
    config.update(train_batch_size=16, train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(deepspeed.comm, "get_rank", lambda *args, **kwargs: 0)
        DeepSpeedConfig(dict(config), mpu=DataParallelOnly(4))  # 4 x 1 x 4 = 16
        with pytest.raises(AssertionError, match="16 != 4 \\* 1 \\* 2"):
            DeepSpeedConfig(dict(config), mpu=DataParallelOnly(2))


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

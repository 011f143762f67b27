"""Every stage's DeepSpeed config, resolved from the run's DeepSpeed JSON as parsed once (launcher/config/deepspeed_json.py
DeepSpeedJson): the stage's batch sizes and the peak learning rate, and the shape (ZeRO stage, precision, world size)
they all train in. A rank's start-up, `roformer plan` and --dry-run resolve them through RunSetup (run_setup.py).
"""
from __future__ import annotations

import copy

from launcher.config.deepspeed_json import DeepSpeedJson
from launcher.config.run_config import RunConfig
from launcher.config.run_shape import RunShape
from launcher.config.stages import ResolvedStage


def ds_config_source(cfg: RunConfig) -> str:
    """The DeepSpeed JSON as named in errors, with the run config's overrides when there are any."""
    if cfg.deepspeed.overrides:
        return f"{cfg.deepspeed.config} (with deepspeed.overrides of {cfg.source})"
    return cfg.deepspeed.config


def resolve_ds_config(run_config: RunConfig, stage: ResolvedStage, world_size: int, ds_json: DeepSpeedJson,
                      load_universal: bool = False) -> dict:
    """The DeepSpeed config the engine starts with in `stage` (resolve_stage_configs), with universal loading
    when the shape changed, from the JSON the caller read (DeepSpeedJson.of, once per command or rank; a rank's
    start-up resolves every stage's at once: launcher/resolved/run_setup.py RunSetup)."""
    config = resolve_stage_configs(run_config, [stage], world_size, ds_json)[0][0]
    if load_universal:
        config.setdefault("checkpoint", {})["load_universal"] = True
    return config


def resolve_stage_configs(run_config: RunConfig, stages: list[ResolvedStage], world_size: int,
                          ds_json: DeepSpeedJson) -> tuple[list[dict], RunShape, str]:
    """Every stage's DeepSpeed config from the JSON read once (`ds_json`): batch sizes of the stage
    (the engine starts with its first stage's and is switched at later boundaries without being rebuilt), the peak
    LR; the shape they train in (the same for every stage); and the JSON as errors name it (ds_config_source)."""
    source = ds_config_source(run_config)
    base, precision = ds_json.config, ds_json.precision
    configs = []
    for stage in stages:
        config = copy.deepcopy(base)
        config["train_batch_size"] = stage.global_batch_size
        config["train_micro_batch_size_per_gpu"] = stage.micro_batch_size
        config["gradient_accumulation_steps"] = stage.grad_accum_steps
        assert stage.micro_batch_size * stage.grad_accum_steps * world_size == stage.global_batch_size
        config.setdefault("optimizer", {}).setdefault("params", {})["lr"] = run_config.optimizer.lr
        config.setdefault("steps_per_print", 10**9)  # our metrics replace DeepSpeed's own step printing
        configs.append(config)
    return configs, RunShape(ds_json.zero_stage, precision, world_size), source

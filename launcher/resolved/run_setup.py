"""The run as resolved, once, where it is checked: every stage's DeepSpeed config (from the JSON read once) through
DeepSpeed's own parser and against the accelerator's precision, the shape they train in, and the init_from directory as
read. `roformer plan`, `pretrain --dry-run` (launcher/inputs/run_checks.py check_run) and every rank at start-up
(launcher/train/rank.py check_inputs) build the same RunSetup, so they agree by construction; the steps after it (the
resume plan, the engine, the trainer) read it and never re-read a file.
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass

from launcher.common.errors import UserError
from launcher.config.deepspeed_json import DeepSpeedJson
from launcher.config.run_config import RunConfig
from launcher.config.run_shape import RunShape
from launcher.config.stages import ResolvedStage
from launcher.resolved.init_from import InitSource
from launcher.resolved.stage_configs import resolve_stage_configs


@dataclass(frozen=True)
class RunSetup:
    """A run's inputs resolved once, where they are checked (every rank's start-up, launcher/train/rank.py;
    `roformer plan` and `pretrain --dry-run`: check_run), so the dry run and the ranks agree by construction.
    What comes after (the resume plan, the engine, the trainer) reads it and never re-reads a file."""

    cfg: RunConfig
    stages: list[ResolvedStage]
    """The schedule's stages at `world_size`."""
    world_size: int
    ds_configs: list[dict]
    """Each stage's DeepSpeed config (its batch sizes, the peak LR), accepted by DeepSpeed's DeepSpeedConfig."""
    ds_source: str
    """The DeepSpeed JSON as errors name it (stage_configs.ds_config_source)."""
    shape: RunShape
    """The ZeRO stage, precision and world size the configs train in (the same for every stage)."""
    init: InitSource | None = None
    """The init_from directory as the run config's load read it (None without init_from)."""

    def ds_config(self, stage_index: int, load_universal: bool = False) -> dict:
        """A copy of stage `stage_index`'s DeepSpeed config (the engine takes it as its own), with load_universal
        set when the start loads through the universal checkpoint."""
        config = copy.deepcopy(self.ds_configs[stage_index])
        if load_universal:
            config.setdefault("checkpoint", {})["load_universal"] = True
        return config


def resolve_setup(cfg: RunConfig, init: InitSource | None, stages: list[ResolvedStage], world_size: int,
                  ds_json: DeepSpeedJson, accelerator_is_the_ranks: bool = True) -> tuple[RunSetup, list[str]]:
    """The setup and the notes of check 1: from the DeepSpeed JSON the caller read once (`ds_json`), every stage's
    config through DeepSpeed's own parser, its precision against the accelerator."""
    if bool(cfg.init_from) != (init is not None):
        raise ValueError(f"{cfg.source}: init_from and its InitSource come together (init_from.load_config_and_init)")
    configs, shape, source, notes = check_deepspeed_configs(cfg, stages, world_size, ds_json,
                                                            accelerator_is_the_ranks)
    return RunSetup(cfg, stages, world_size, configs, source, shape, init), notes


def check_deepspeed_configs(cfg: RunConfig, stages: list[ResolvedStage], world_size: int, ds_json: DeepSpeedJson,
                            accelerator_is_the_ranks: bool = True) -> tuple[list[dict], RunShape, str, list[str]]:
    """Every stage's DeepSpeed config (from the JSON read once: `ds_json`) through DeepSpeedConfig, then
    precision vs accelerator: (the configs, the shape they train in, the JSON as errors name it, the notes)."""
    from deepspeed.runtime.config import DeepSpeedConfig

    configs, shape, source = resolve_stage_configs(cfg, stages, world_size, ds_json)
    for stage, config in zip(stages, configs):
        # The per-rank view: before a process group exists DeepSpeedConfig takes world size 1 (our
        # stage arithmetic, micro x accum x world = global, is checked in launcher/config/stages.py).
        per_rank = {**config, "train_batch_size": stage.micro_batch_size * stage.grad_accum_steps}
        try:
            DeepSpeedConfig(per_rank)
        except Exception as err:  # pydantic ValidationError, AssertionError, DeepSpeedConfigError, ...
            raise UserError(f"{source}: rejected by DeepSpeed's DeepSpeedConfig: {_describe(err, per_rank)}") from None
    precision = shape.precision  # every stage's config has the same precision sections
    # None: the ranks' device is declared (hardware.device, `plan --device-name`): checked against that, not here.
    asked = precision != "fp32" and accelerator_is_the_ranks is not None
    note = _check_precision(precision, source, accelerator_is_the_ranks) if asked else None
    return configs, shape, source, [note] if note else []


def _check_precision(precision: str, source: str, binding: bool) -> str | None:
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    supported = accelerator.is_fp16_supported() if precision == "fp16" else accelerator.is_bf16_supported()
    if supported:
        return None
    name = accelerator.device_name()
    chosen = f"DS_ACCELERATOR={os.environ['DS_ACCELERATOR']}" if "DS_ACCELERATOR" in os.environ else "detected"
    what = (f"{source}: {precision}.enabled: DeepSpeed's {name} accelerator ({chosen}) does not support {precision} "
            f"(get_accelerator().is_{precision}_supported() is {supported!r})")
    if binding:
        other = "bf16 or fp32" if precision == "fp16" else "fp32"
        raise UserError(f"{what}; use a {other} DeepSpeed config, e.g. ds_configs/cpu_fp32_zero2.json on CPU")
    return f"{what} on this machine; each rank checks it again on its own node"


def _describe(err: Exception, config: dict) -> str:
    """One line for a DeepSpeedConfig failure, naming the field (section.key) where pydantic says which."""
    errors = getattr(err, "errors", None)
    if callable(errors):  # pydantic.ValidationError: the model's fields, not the JSON's sections
        parts = []
        for item in errors():
            loc = ".".join(str(x) for x in item.get("loc", ()))
            first = item["loc"][0] if item.get("loc") else None
            holders = [k for k, v in config.items() if isinstance(v, dict) and first in v]
            exact = [k for k in holders if config[k][first] == item.get("input")]
            section = (exact or holders or [None])[0]
            where = f"{section}.{loc}" if section else loc or getattr(err, "title", "config")
            parts.append(f"{where}: {item.get('msg')} (got {item.get('input')!r})")
        return "; ".join(parts)
    return " ".join(f"{type(err).__name__}: {err}".split())

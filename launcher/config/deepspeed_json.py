"""The DeepSpeed JSON of a run, parsed once (DeepSpeedJson): a shipped file (ds_configs/) checked against DeepSpeed's
own keys, with the run config's deepspeed.overrides merged. Each stage's config (its batch sizes, the peak learning
rate) is resolved from it in launcher/resolved/stage_configs.py.
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path

from launcher.common.io import read_mapping
from launcher.config.precision import train_precision
from launcher.config.run_config import RunConfig
from launcher.common.errors import UserError
from launcher.deepspeed_env.optimizer_check import check_optimizer, merged_optimizer

# Keys our resolver owns: a DeepSpeed JSON that sets them would silently disagree with the schedule.
RESOLVED_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def load_ds_json(path: str | Path, overrides: dict | None = None) -> dict:
    """Read a shipped DeepSpeed JSON, reject keys DeepSpeed does not know and keys we resolve."""
    return read_ds_json(path, overrides)[0]


def read_ds_json(path: str | Path, overrides: dict | None = None) -> tuple[dict, str]:
    """load_ds_json's config and the precision it trains in (launcher/config/precision.py)."""
    path = Path(path)
    base = read_mapping(path, "DeepSpeed config")
    config = _deep_merge(base, overrides or {})
    if isinstance(overrides, dict) and "optimizer" in overrides:
        config["optimizer"] = merged_optimizer(base.get("optimizer"), overrides["optimizer"])
    check_optimizer(config.get("optimizer"), (overrides or {}).get("optimizer"),
                    f"{path}{' (with deepspeed.overrides)' if overrides else ''}")
    known = deepspeed_top_level_keys()
    unknown = sorted(k for k in config if k not in known)
    if unknown:
        raise UserError(f"{path}: unknown DeepSpeed key(s): {', '.join(unknown)}")
    owned = [k for k in RESOLVED_KEYS if k in config]
    if owned:
        raise UserError(f"{path}: {', '.join(owned)}: batch sizes come from the schedule; remove them here")
    if config.get("gradient_allreduce_op", "mean") != "mean":
        # The trainer's loss scale (world_size / global masked count) assumes DeepSpeed averages
        # gradients over ranks; "sum" would silently multiply every gradient by the world size.
        raise UserError(f"{path}: gradient_allreduce_op: only 'mean' is supported (the trainer normalises the "
                        f"loss by the global masked-token count), got {config['gradient_allreduce_op']!r}")
    precision = train_precision(config, str(path))  # "auto", both spellings, ...: refused here, once
    if precision != "fp32" and (config.get("zero_optimization") or {}).get("stage", 0) == 0:
        # ZeRO-0 keeps the fp32 master weights only inside the mixed-precision optimizer's own
        # format, which zero_to_fp32 cannot consolidate: such a run could not be exported in fp32.
        raise UserError(f"{path}: zero_optimization.stage: 0 with {precision} cannot be exported in fp32; "
                        f"use stage 1, 2 or 3")
    if "scheduler" in config:
        raise UserError(f"{path}: scheduler: the learning rate comes from the run config's optimizer section "
                        f"(launcher/config/schedule.py); remove the DeepSpeed scheduler")
    return config, precision


@dataclass(frozen=True)
class DeepSpeedJson:
    """A run's DeepSpeed JSON, read and checked once (read_ds_json): what `micro_batch_size: auto`'s memory plan and
    every stage's config start from."""

    config: dict
    """The JSON with the run config's deepspeed.overrides merged, before any stage's batch sizes."""
    precision: str
    zero_stage: int = 0
    """zero_optimization.stage (0 when absent), parsed once with the precision."""

    @classmethod
    def of(cls, run_config: RunConfig) -> "DeepSpeedJson":
        return cls.from_config(*read_ds_json(run_config.deepspeed.config, run_config.deepspeed.overrides))

    @classmethod
    def from_config(cls, config: dict, precision: str | None = None) -> "DeepSpeedJson":
        """A JSON already read (read_ds_json's, or a shipped one gpu-check loads): precision and ZeRO stage parsed here."""
        return cls(config, precision or train_precision(config),
                   int((config.get("zero_optimization") or {}).get("stage", 0)))


def deepspeed_top_level_keys() -> frozenset[str]:
    """Top-level keys DeepSpeed reads, collected from its own source: the string constants of its
    config/constants modules, the quoted keys of deepspeed/runtime/config.py and the monitor sections."""
    import inspect
    import sys

    import deepspeed.monitor.config as monitor_config
    import deepspeed.runtime.config as runtime_config

    keys = set(re.findall(r"[\"']([a-z][a-z0-9_]*)[\"']", inspect.getsource(runtime_config)))
    for name, module in list(sys.modules.items()):
        if name.startswith("deepspeed") and ("constants" in name or "config" in name) and module:
            keys.update(v for k, v in vars(module).items()
                        if k.isupper() and isinstance(v, str) and re.fullmatch(r"[a-z][a-z0-9_]*", v))
    keys.update(monitor_config.DeepSpeedMonitorConfig.model_fields)
    return frozenset(keys)


def _deep_merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out

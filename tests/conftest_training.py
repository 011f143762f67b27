"""Shared helpers of the training tests (imported explicitly; not a pytest plugin)."""
from __future__ import annotations

import copy
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]

TINY_MODEL = {"vocab_size": 600, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
              "intermediate_size": 64, "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}


def run_config_dict(data_dir: str | Path = "/nonexistent-data", schedule_file: str | Path | None = None,
                    ds_config: str = "cpu_fp32_zero2.json", **sections) -> dict:
    """A complete run config as a dict; `sections` deep-update it (e.g. optimizer={"lr": 1e-3})."""
    config = {
        "seed": 7,
        "model": copy.deepcopy(TINY_MODEL),
        "data": {"data_dir": str(data_dir), "seed": 11},
        "optimizer": {"lr": 2e-3, "warmup_steps": 3, "decay": "linear", "min_lr_ratio": 0.1},
        "schedule": {"file": str(schedule_file or REPO / "launcher/schedules/tiny_cpu.yaml"),
                     "max_tokens_per_micro_batch": 256},
        "checkpoint": {"every_steps": 0, "keep_last": 2},
        "logging": {"log_every": 1, "valid_every": 0, "valid_batches": 1, "progress_bar": False},
        "deepspeed": {"config": str(REPO / "ds_configs" / ds_config)},
    }
    for name, values in sections.items():
        if isinstance(values, dict) and isinstance(config.get(name), dict):
            config[name].update(values)
        else:
            config[name] = values
    return config


def write_yaml(path: Path, content: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(content, sort_keys=False), encoding="utf-8")
    return path


def write_schedule(path: Path, stages: list[dict]) -> Path:
    return write_yaml(path, {"stages": stages})

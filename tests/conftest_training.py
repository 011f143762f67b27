"""Shared helpers of the training tests (imported explicitly; not a pytest plugin)."""
from __future__ import annotations

import copy
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]

TINY_MODEL = {"vocab_size": 900, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
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


# --- multi-rank runs --------------------------------------------------------------------------
# We start DeepSpeed's per-node launcher (deepspeed.launcher.launch) ourselves instead of the
# `deepspeed` runner: the runner's SIGTERM handler pkills matching processes machine-wide, and the
# tests signal their own runs only (by PID / process group).

import base64  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_command(num_ranks: int, module: str, args: list[str], port: int | None = None) -> list[str]:
    world_info = base64.urlsafe_b64encode(json.dumps({"localhost": list(range(num_ranks))}).encode()).decode()
    return [sys.executable, "-u", "-m", "deepspeed.launcher.launch", f"--world_info={world_info}", "--node_rank=0",
            "--master_addr=127.0.0.1", f"--master_port={port or free_port()}", "--module", module, *args]


def rank_env(**extra: str) -> dict:
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONPATH=str(REPO),
               TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    # Same op cache as the Makefile / CI, so DeepSpeed's CPU shm-comm op compiles once.
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache/roformer-ds/torch_extensions"))
    env.update(extra)
    return env


def start_run(num_ranks: int, config: Path, run_dir: Path, module: str = "launcher.train.rank_entry",
              extra_args: list[str] = (), log: Path | None = None, **env: str) -> subprocess.Popen:
    """Start a run in its own process group (so a test can signal exactly this run)."""
    log = log or run_dir.parent / f"{run_dir.name}.log"
    handle = open(log, "ab")
    cmd = launch_command(num_ranks, module, ["--config", str(config), "--run-dir", str(run_dir), *extra_args])
    return subprocess.Popen(cmd, cwd=REPO, env=rank_env(**env), stdout=handle, stderr=subprocess.STDOUT,
                            start_new_session=True)


def run_to_end(num_ranks: int, config: Path, run_dir: Path, timeout: float = 240, **kwargs) -> int:
    proc = start_run(num_ranks, config, run_dir, **kwargs)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        raise


# --- the shared tiny run ----------------------------------------------------------------------
# Three stages that change both length and batch (and grad-accum: the 64-token stage needs 2 micro-
# batches per rank under the 128-token budget), checkpoints every 4 steps plus stage ends.
TINY_STAGES = [
    {"name": "short", "max_seq_len": 32, "global_batch_size": 8, "steps": 6},
    {"name": "long", "max_seq_len": 64, "global_batch_size": 8, "steps": 4},
    {"name": "wide", "max_seq_len": 16, "global_batch_size": 16, "steps": 6},
]
TINY_TOTAL_STEPS = 16
_RUNS: dict[str, Path] = {}


def tiny_data_dir(tmp_factory) -> Path:
    """A real prepared corpus (SentencePiece, shards), shared with the data tests in one process."""
    from tests.test_data_common import prepared_dir

    return prepared_dir(tmp_factory)


def tiny_run_config(root: Path, data_dir: Path, name: str = "run.yaml", ds_config: str = "cpu_fp32_zero2.json",
                    **sections) -> Path:
    schedule = write_schedule(root / "tiny_schedule.yaml", TINY_STAGES)
    base = {"checkpoint": {"every_steps": 4, "keep_last": 3},
            "logging": {"valid_every": 5, "valid_batches": 1, "progress_bar": True},
            "schedule": {"max_tokens_per_micro_batch": 128}}
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return write_yaml(root / name, run_config_dict(data_dir=data_dir, schedule_file=schedule, ds_config=ds_config,
                                                   **base))


def reference_run(tmp_factory, key: str, num_ranks: int = 2, env: dict | None = None, **sections) -> Path:
    """An uninterrupted run, made once per pytest process per key; returns its run directory."""
    if key in _RUNS:
        return _RUNS[key]
    root = tmp_factory.mktemp(f"ref_{key}")
    config = tiny_run_config(root, tiny_data_dir(tmp_factory), **sections)
    run_dir = root / "run"
    rc = run_to_end(num_ranks, config, run_dir, module="tests._rank_wrapper", **(env or {}))
    assert rc == 0, (root / "run.log").read_text()[-5000:]
    _RUNS[key] = run_dir
    return run_dir


def train_losses(run_dir: Path) -> dict[int, float]:
    from launcher.train.metrics import read_metrics

    return {r["step"]: r["loss"] for r in read_metrics(run_dir, "train")}

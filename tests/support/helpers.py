"""Helpers shared by the tests (imported explicitly; fixtures live in tests/conftest.py).

One copy each of: the run-config builders, the environment a rank or a `roformer` command gets, a
free port, the DeepSpeed per-node launch command, and the readers of a run's metrics.

Multi-rank runs start DeepSpeed's per-node launcher (deepspeed.launcher.launch, through
launcher.launch.deepspeed_processes) directly instead of the `deepspeed` runner: the runner's SIGTERM handler
pkills matching processes machine-wide, and the tests signal their own runs only (by PID / process group).
"""
from __future__ import annotations

import base64
import copy
import json
import os
import signal
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

import yaml

from launcher.common.defaults import DEFAULT_MASTER_PORT
from launcher.launch.ports import claim_port

REPO = Path(__file__).resolve().parents[2]
RANK_ENTRY = "launcher.train.rank_entry"
TEST_RANK_ENTRY = "tests.support.rank_wrapper"  # the rank entry plus faults chosen by environment variables

TINY_MODEL = {"vocab_size": 900, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
              "intermediate_size": 64, "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
# Three stages that change both length and batch (and grad-accum: the 64-token stage needs 2 micro-
# batches per rank under the 128-token budget), checkpoints every 4 steps plus stage ends.
TINY_STAGES = [
    {"name": "short", "max_seq_len": 32, "global_batch_size": 8, "steps": 6},
    {"name": "long", "max_seq_len": 64, "global_batch_size": 8, "steps": 4},
    {"name": "wide", "max_seq_len": 16, "global_batch_size": 16, "steps": 6},
]
TINY_TOTAL_STEPS = sum(stage["steps"] for stage in TINY_STAGES)
TINY_MAX_SEQ_LEN = max(stage["max_seq_len"] for stage in TINY_STAGES)


# --- run configs ----------------------------------------------------------------------------------


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
        # No background plot renders and a fixed MFU peak: each render and the start-up matmul timing
        # cost seconds per start in a suite of ~100 starts. The session's `trainer_run` keeps both.
        "logging": {"log_every": 1, "valid_every": 0, "valid_batches": 1, "progress_bar": False, "plots": False,
                    "peak_tflops": 0.1},
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


def tiny_run_config(root: Path, data_dir: Path, name: str = "run.yaml", ds_config: str = "cpu_fp32_zero2.json",
                    stages: list[dict] = TINY_STAGES, **sections) -> Path:
    """The tiny run (TINY_STAGES unless `stages`) on `data_dir`, written to root/name; its schedule is
    root/tiny_schedule.yaml (shared by the configs of one root)."""
    schedule = write_schedule(root / "tiny_schedule.yaml", stages)
    base = {"checkpoint": {"every_steps": 4, "keep_last": 3},
            "logging": {"valid_every": 5, "valid_batches": 1, "progress_bar": True},
            "schedule": {"max_tokens_per_micro_batch": 128}}
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return write_yaml(root / name, run_config_dict(data_dir=data_dir, schedule_file=schedule, ds_config=ds_config,
                                                   **base))


def tiny_data_dir(tmp_factory) -> Path:
    """A real prepared corpus (SentencePiece, shards), built once per session by the data tests' builder
    (use the `tiny_data` fixture in new tests)."""
    from tests.support.corpus_files import prepared_dir

    return prepared_dir(tmp_factory)


# --- processes ------------------------------------------------------------------------------------


# Test ports: below `roformer pretrain`'s own from 29500 up and the kernel's ephemeral ports (32768 up,
# which port 0 hands out and any connection may hold), claimed as the CLI claims its own
# (launcher/launch/ports.py), so two pytest processes (the lanes of scripts/run_tests.sh, or two
# worktrees) never get the same one. Each process starts its scan elsewhere, to pass fewer claims.
TEST_PORTS = range(20000, DEFAULT_MASTER_PORT)


def free_port() -> int:
    """A port free now and claimed by this test process until it exits."""
    start = os.getpid() % len(TEST_PORTS)
    return claim_port([*TEST_PORTS[start:], *TEST_PORTS[:start]])


def roformer_env(**extra: str) -> dict[str, str]:
    """The environment of a `roformer` command (as the Makefile sets it)."""
    from launcher.deepspeed_env.ops_cache import ENV_VAR, extensions_dir

    env = dict(os.environ, DS_ACCELERATOR="cpu", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    # This environment's op cache, as every rank uses (launcher/deepspeed_env/ops_cache.py).
    env[ENV_VAR] = str(extensions_dir(env))
    env.update(extra)
    return env


def rank_env(**extra: str) -> dict[str, str]:
    """The environment of ranks started directly (no `roformer pretrain` to forward it)."""
    return roformer_env(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), **extra)


def launch_command(num_ranks: int, module: str, args: list[str], port: int | None = None) -> list[str]:
    """DeepSpeed's per-node launcher starting `python -m module args` on `num_ranks` local ranks."""
    world_info = base64.urlsafe_b64encode(json.dumps({"localhost": list(range(num_ranks))}).encode()).decode()
    from launcher.launch.launch_plan import DEEPSPEED_PROCESSES

    return [sys.executable, "-u", "-m", DEEPSPEED_PROCESSES, "launch", f"--world_info={world_info}", "--node_rank=0",
            "--master_addr=127.0.0.1", f"--master_port={port or free_port()}", "--module", module, *args]


def start_run(num_ranks: int, config: Path, run_dir: Path, module: str = RANK_ENTRY, extra_args: list[str] = (),
              log: Path | None = None, port: int | None = None, warm: bool = True, **env: str):
    """Start a run in its own process group (so a test can signal exactly this run); output to
    RUN_DIR/../<name>.log. `warm`: its ranks forked from the session's warm process (tests/support/fork_server.py:
    no interpreter start-up, no torch or DeepSpeed import) instead of started by DeepSpeed's launcher; False where
    the launcher, the console or the processes' command lines are the subject."""
    log = log or run_dir.parent / f"{run_dir.name}.log"
    args = ["--config", str(config), "--run-dir", str(run_dir), *extra_args]
    if warm and os.environ.get(NO_FORK_SERVER_VAR) != "1":
        return fork_server().start(num_ranks, module, args, port or free_port(), rank_env(**env), REPO, log)
    cmd = launch_command(num_ranks, module, args, port=port)
    with open(log, "ab") as handle:
        return subprocess.Popen(cmd, cwd=REPO, env=rank_env(**env), stdout=handle, stderr=subprocess.STDOUT,
                                start_new_session=True)


NO_FORK_SERVER_VAR = "ROFORMER_TEST_NO_FORK_SERVER"
"""=1: every test run through DeepSpeed's launcher, as before the fork server (to compare, or to rule it out)."""
_fork_server = None


def fork_server():
    """This pytest process's warm process (started at its first job; `stop_fork_server` at the session's end)."""
    global _fork_server
    if _fork_server is None:
        from tests.support.fork_server import ForkServer

        _fork_server = ForkServer(rank_env(), REPO)
    return _fork_server


def stop_fork_server() -> None:
    global _fork_server
    if _fork_server is not None:
        _fork_server.stop()
        _fork_server = None


def run_to_end(num_ranks: int, config: Path, run_dir: Path, timeout: float = 600, **kwargs) -> None:
    """A run that must finish (exit code 0); the log's tail is the failure message otherwise."""
    proc = start_run(num_ranks, config, run_dir, **kwargs)
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        raise
    log = run_dir.parent / f"{run_dir.name}.log"
    assert rc == 0, f"run {run_dir} failed (rc {rc}):\n{log.read_text(errors='replace')[-5000:]}"


def roformer(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO,
             timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `roformer ARGS` (python -m launcher) and capture its output."""
    return subprocess.run([sys.executable, "-m", "launcher", *args], cwd=cwd, env=env or roformer_env(),
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def start_roformer(*args: str, env: dict[str, str], log: Path) -> subprocess.Popen:
    """Start `roformer ARGS` in the background (its own session), output to `log`, with SIGHUP at its default as
    a terminal's command has it, however the suite was started (`nohup make test` ignores it, and an ignored
    SIGHUP is inherited: the command keeps it ignored, as it should under nohup)."""
    with open(log, "w") as handle:
        return subprocess.Popen([sys.executable, "-m", "launcher", *args], cwd=REPO, env=env, stdout=handle,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=hangup_at_default)


def hangup_at_default() -> None:
    """Popen's preexec_fn: SIGHUP at its default in the child (a suite run under nohup passes it on ignored)."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def fake_tools(bin_dir: Path, log: Path, names=("ssh", "pdsh", "mpirun")) -> dict[str, str]:
    """Stand-ins first on PATH that record every call; returns an env with them in front."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        tool = bin_dir / name
        tool.write_text(f'#!/bin/dash\necho "{name} $*" >> {log}\nexit 99\n')
        tool.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}


# --- what a run left ------------------------------------------------------------------------------


def train_losses(run_dir: Path) -> dict[int, float]:
    from launcher.train.metrics import read_metrics

    return {r["step"]: r["loss"] for r in read_metrics(run_dir, "train")}


def metrics_steps(run_dir: Path) -> list[int]:
    from launcher.train.metrics import read_metrics

    return [r["step"] for r in read_metrics(run_dir, "train")]


def events(run_dir: Path, name: str) -> list[dict]:
    from launcher.train.metrics import read_metrics

    return [r for r in read_metrics(run_dir, "event") if r.get("event") == name]


def hf_isolated_logits(export_dirs: list[Path], texts: list[str], work: Path) -> list[dict]:
    """Tokenizer ids + MLM logits from transformers alone, in ONE process with project imports blocked."""
    from safetensors.torch import load_file

    (work / "texts.json").write_text(json.dumps(texts), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-I", str(REPO / "tests" / "support" / "hf_isolated.py"), str(work / "texts.json"),
                           str(work), *map(str, export_dirs)], cwd=work, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    infos = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(infos) == len(export_dirs), proc.stdout
    return [{**load_file(str(work / f"hf_out_{i}.safetensors")), "info": info} for i, info in enumerate(infos)]


def stored_run_resume_config(run_dir, extra_steps: int = 3):
    """The stored run's own config (its model, data and seeds) with a third stage to train, its paths
    pointing at this machine's copies."""
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["data"]["data_dir"] = str(run_dir.parent / "data")
    config["deepspeed"]["config"] = str(REPO / "ds_configs" / "cpu_fp32_zero2.json")
    stages = json.loads((run_dir / "stages.json").read_text())["stages"]
    schedule = [{k: s[k] for k in ("name", "max_seq_len", "global_batch_size", "steps")} for s in stages]
    schedule.append({"name": "more", "max_seq_len": 32, "global_batch_size": 8, "steps": extra_steps})
    config["schedule"]["file"] = str(write_schedule(run_dir.parent / "resume_schedule.yaml", schedule))
    config["logging"]["progress_bar"] = False
    return write_yaml(run_dir.parent / "resume.yaml", config)


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def check_png(path: Path, colours: tuple = (), min_pixels: int = 200) -> None:
    """A real, decodable 1200 x 800 PNG with content (and min_pixels of each given RGB colour)."""
    import numpy as np
    from matplotlib.image import imread

    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path}: not a PNG"
    width, height = struct.unpack(">II", data[16:24])  # IHDR
    assert (width, height) == (1200, 800), f"{path}: {width}x{height}"
    assert 15_000 < len(data) < 400_000, f"{path}: {len(data)} bytes"
    pixels = imread(path)
    assert pixels.shape[:2] == (800, 1200)
    rgb = (pixels[..., :3] * 255).round().astype(int).reshape(-1, 3)
    assert len(np.unique(rgb @ [65536, 256, 1])) > 50, f"{path}: nearly blank"
    for colour in colours:
        assert (np.abs(rgb - colour).sum(axis=1) <= 6).sum() >= min_pixels, f"{path}: nothing in colour {colour}"


def report_of(run_dir: Path, out: Path, cli: bool = False) -> str:
    """`roformer report RUN_DIR --out OUT` in this process (a process of its own costs ~3 CPU-s of imports), or
    as the command (`cli`: tests/unit/test_report.py's check of the command itself); the plots it printed are
    OUT/plots' PNGs. report.md's text."""
    if cli:
        proc = roformer("report", str(run_dir), "--out", str(out))
        assert proc.returncode == 0, proc.stderr
        printed = proc.stdout
    else:
        import contextlib
        import io

        from launcher.cli import main as cli_main

        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            assert cli_main(["report", str(run_dir), "--out", str(out)]) == 0
        printed = stdout.getvalue()
    written = sorted(Path(line).name for line in printed.split())
    assert written == sorted(p.name for p in (out / "plots").glob("*.png"))
    return (out / "report.md").read_text(encoding="utf-8")


def newest_checkpoint(run_dir: Path):
    """The newest complete checkpoint of a run directory (a CheckpointEntry: tag, step, path, sidecar), None
    when there is none; its files are not verified (launcher/checkpoint/catalogue.py)."""
    from launcher.checkpoint.catalogue import CheckpointCatalogue

    complete = CheckpointCatalogue.scan(run_dir).complete()
    return complete[-1] if complete else None


def trimmed_copy(run_dir: Path, dest: Path, step: int) -> Path:
    """A copy of a finished run as a stop after `step` leaves it (its newest checkpoint global_step<step>, which the
    run must have kept), to resume instead of a fresh run stopped there; without reference.safetensors (the live
    weights the test rank entry saves at the end), so a resume that saves none fails a comparison."""
    import shutil

    shutil.copytree(run_dir, dest)
    for checkpoint in (dest / "checkpoints").glob("global_step*"):
        if int(checkpoint.name.removeprefix("global_step")) > step:
            shutil.rmtree(checkpoint)
    assert (dest / "checkpoints" / f"global_step{step}").is_dir(), f"{run_dir} kept no global_step{step}"
    (dest / "checkpoints" / "latest").write_text(f"global_step{step}")
    (dest / "reference.safetensors").unlink(missing_ok=True)
    return dest


def write_complete_checkpoint(run_dir, step: int, files: dict | None = None, tag: str | None = None) -> Path:
    """RUN_DIR/checkpoints/<tag> (global_step<step>) with a complete format-2 sidecar recording `files` (name ->
    {"bytes", "sha256"}; none by default) and `latest` naming it: a checkpoint as the catalogue sees it,
    without DeepSpeed's files. `run_dir`: a launcher.run_dir.layout.RunDir."""
    from launcher.checkpoint.catalogue import CheckpointSidecar, write_save_record, write_sidecar

    directory = run_dir.checkpoint(tag or f"global_step{step}")
    write_save_record(directory, directory.name)  # as a save does first: the folder is this run's
    write_sidecar(directory, CheckpointSidecar(
        tag=f"global_step{step}", step=step, stage_index=0, stage_name="a", step_in_stage=step, stage_complete=False,
        consumed_samples=8 * step, consumed_tokens=0, last_validation={}, data_state={}, model_config={},
        world_size=2, loss_scale=1.0, skipped_steps=0, zero_stage=2, precision="fp32", total_steps=20,
        files=files or {}))
    run_dir.latest.write_text(directory.name)
    return directory


def finetune_refused(capsys, export: Path, tmp_path: Path, flags: list[str], predictions: str = "predictions.csv") -> str:
    """`roformer finetune EXPORT FLAGS` with every output flag set: exit 2, one line, nothing written; the line."""
    from launcher.cli import main as cli_main

    outputs = {"--out": tmp_path / "report.json", "--save-model": tmp_path / "model",
               "--predictions": tmp_path / predictions}
    capsys.readouterr()
    rc = cli_main(["finetune", str(export), *flags, *[str(a) for pair in outputs.items() for a in pair]])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("roformer finetune: error: "), err
    assert not any(path.exists() for path in outputs.values())
    return err[0]


def in_process_cli(monkeypatch, capsys):
    """`run(*args)`: `roformer ARGS` in this process, returning (exit code, stdout, stderr)."""
    from launcher.cli import main as cli_main

    monkeypatch.setattr(sys, "argv", list(sys.argv))

    def run(*args: str) -> tuple[int, str, str]:
        code = cli_main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def init_from_config(tmp_path: Path, init_from, model: dict | None = None, data_dir="/nonexistent-data",
                     **sections) -> Path:
    """A run config continuing `init_from`, with no model section unless `model` is given."""
    raw = run_config_dict(data_dir=data_dir, **sections)
    raw.pop("model")
    if model is not None:
        raw["model"] = model
    raw["init_from"] = str(init_from)
    return write_yaml(tmp_path / "run.yaml", raw)


def bfloat16_copy(directory: Path) -> Path:
    """ds_configs/cpu_bf16_zero2.json with its bf16 section under DeepSpeed's older name `bfloat16`."""
    config = json.loads((REPO / "ds_configs" / "cpu_bf16_zero2.json").read_text())
    config["bfloat16"] = config.pop("bf16")
    path = directory / "cpu_bfloat16_zero2.json"
    path.write_text(json.dumps(config, indent=2))
    return path


def extract_archive(path: Path, root: Path) -> None:
    """The tar archive at `path` unpacked under `root`, nothing landing outside it: Python's "data" filter where it has
    one (3.11.4 on); Debian 12's 3.11.2 has none, so there plain files and directories under `root` only (stricter:
    no links at all), checked before anything is written."""
    with tarfile.open(path) as archive:
        if hasattr(tarfile, "data_filter"):
            archive.extractall(root, filter="data")
            return
        base = Path(root).resolve()
        for member in archive.getmembers():
            if not (member.isfile() or member.isdir()) or not (base / member.name).resolve().is_relative_to(base):
                raise tarfile.TarError(f"{path}: member {member.name!r} is not a plain file or directory under {root}")
        archive.extractall(root)

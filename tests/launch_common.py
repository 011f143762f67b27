"""Helpers shared by the launcher tests (imported explicitly)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def roformer_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, DS_ACCELERATOR="cpu", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache/roformer-ds/torch_extensions"))
    env.update(extra)
    return env


def roformer(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO,
             timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `roformer ARGS` (python -m launcher) and capture its output."""
    return subprocess.run([sys.executable, "-m", "launcher", *args], cwd=cwd, env=env or roformer_env(),
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def start_roformer(*args: str, env: dict[str, str], log: Path) -> subprocess.Popen:
    """Start `roformer ARGS` in the background (its own session), output to `log`."""
    handle = open(log, "w")
    return subprocess.Popen([sys.executable, "-m", "launcher", *args], cwd=REPO, env=env, stdout=handle,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def fake_tools(bin_dir: Path, log: Path, names=("ssh", "pdsh", "mpirun")) -> dict[str, str]:
    """Stand-ins first on PATH that record every call; returns an env with them in front."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        tool = bin_dir / name
        tool.write_text(f'#!/bin/dash\necho "{name} $*" >> {log}\nexit 99\n')
        tool.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}


def metrics_steps(run_dir: Path) -> list[int]:
    from launcher.train.metrics import read_metrics

    return [r["step"] for r in read_metrics(run_dir, "train")]


def events(run_dir: Path, name: str) -> list[dict]:
    from launcher.train.metrics import read_metrics

    return [r for r in read_metrics(run_dir, "event") if r.get("event") == name]

"""Importing any module of the project changes no environment variable and not sys.argv.

Process-wide settings (OMP_NUM_THREADS, DeepSpeed's TORCH_EXTENSIONS_DIR) belong to the function that
starts a rank (launcher.train.rank_entry.prepare_process_environment), argument parsing to
launcher.cli.main: a library user, a test or a benchmark that imports our modules keeps its own.
"""
from __future__ import annotations

import json
import subprocess
import sys

from tests.support.helpers import REPO

PROBE = r"""
import importlib, json, os, pkgutil, sys
# Third-party libraries may set variables of their own when imported (torch sets
# PYTORCH_NVML_BASED_CUDA_CHECK): import them first, so that only our modules are measured.
for library in ("torch", "deepspeed", "transformers", "datasets", "sentencepiece", "safetensors", "matplotlib", "yaml"):
    importlib.import_module(library)
before_env, before_argv = dict(os.environ), list(sys.argv)
imported = []
for package in ("roformer", "data_pipeline", "launcher"):
    root = importlib.import_module(package)
    for info in pkgutil.walk_packages(root.__path__, prefix=package + "."):
        if info.name.endswith("__main__"):
            continue  # `python -m launcher` runs the command line: not a library module
        importlib.import_module(info.name)
        imported.append(info.name)
changed = {k: os.environ.get(k) for k in set(before_env) | set(os.environ) if before_env.get(k) != os.environ.get(k)}
print(json.dumps({"imported": imported, "changed_env": changed, "argv_changed": sys.argv != before_argv}))
"""


def test_importing_every_module_changes_no_environment_variable_and_no_argv():
    env = {"PATH": "/usr/bin:/bin", "HOME": str(REPO), "DS_ACCELERATOR": "cpu"}  # no OMP_NUM_THREADS set
    proc = subprocess.run([sys.executable, "-c", PROBE, "--an-argument"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "launcher.train.rank_entry" in result["imported"] and "launcher.cli" in result["imported"]
    assert len(result["imported"]) > 80
    assert result["changed_env"] == {}
    assert result["argv_changed"] is False


def test_cli_main_parses_the_arguments_it_is_given_and_leaves_sys_argv_alone(monkeypatch, capsys):
    from launcher.cli import main

    monkeypatch.setattr(sys, "argv", ["caller", "--caller-flag"])
    try:
        main(["plan", "--help"])
    except SystemExit as done:
        assert done.code == 0
    assert sys.argv == ["caller", "--caller-flag"]
    assert "--world-size" in capsys.readouterr().out

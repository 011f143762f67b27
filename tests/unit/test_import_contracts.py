"""The direction of dependencies between the packages (setup.cfg [importlinter]) holds, and breaking
it is caught: `lint-imports` on the project, then on a copy with one import pointing the wrong way."""
from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.helpers import REPO

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
_SETUP_CFG = configparser.ConfigParser()
_SETUP_CFG.read(REPO / "setup.cfg")
ACYCLIC_DATA_PIPELINE = _SETUP_CFG["importlinter:contract:data-pipeline-acyclic"]["name"]
CONFIG_REACHES_NO_RUN_DIR = _SETUP_CFG["importlinter:contract:config-reaches-no-run-dir"]["name"]
CONTRACTS = sum(section.startswith("importlinter:contract:") for section in _SETUP_CFG.sections())


def _lint_imports(project: Path) -> subprocess.CompletedProcess:
    # lint-imports puts its working directory first on sys.path: it analyses the packages found there.
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=project, capture_output=True, text=True, timeout=300)


def test_the_contracts_hold():
    assert CONTRACTS >= 4  # roformer, data_pipeline, launcher.config, launcher.train (docs/INTERFACES.md)
    result = _lint_imports(REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert f"Contracts: {CONTRACTS} kept, 0 broken." in result.stdout


def test_a_wrong_import_breaks_its_contract(tmp_path):
    for package in ("roformer", "data_pipeline", "launcher"):
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "setup.cfg", tmp_path / "setup.cfg")
    trainer = tmp_path / "launcher" / "train" / "trainer.py"
    clean = _lint_imports(tmp_path).stdout
    trainer.write_text(trainer.read_text() + "\nfrom launcher.downstream.fine_tuning import finetune  # wrong way\n")
    # A circle hidden inside a function is a circle too: the manifest's reader is below the shards.
    manifest = tmp_path / "data_pipeline" / "manifest.py"
    manifest.write_text(manifest.read_text() + "\n\ndef wrong_way():\n    from data_pipeline.shards import open_corpus\n")
    # The config layer reaching the run lock through a shared module is forbidden too (indirect imports count).
    local_paths = tmp_path / "launcher" / "common" / "local_paths.py"
    local_paths.write_text(local_paths.read_text() + "\n\ndef wrong_way():\n    from launcher.run_dir.lock import pid_alive\n")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    assert "launcher.train does not import launcher.downstream KEPT" in clean
    assert "launcher.train does not import launcher.downstream BROKEN" in result.stdout
    assert "launcher.train.trainer -> launcher.downstream.fine_tuning" in result.stdout
    assert f"{ACYCLIC_DATA_PIPELINE} KEPT" in clean and f"{ACYCLIC_DATA_PIPELINE} BROKEN" in result.stdout
    assert f"{CONFIG_REACHES_NO_RUN_DIR} KEPT" in clean and f"{CONFIG_REACHES_NO_RUN_DIR} BROKEN" in result.stdout
    assert "launcher.common.local_paths -> launcher.run_dir.lock" in result.stdout


def test_the_config_layer_imports_without_torch_or_the_trackers():
    """What `roformer plan`, the dry run and every check of a config import: no torch (roformer's exports load
    when named), no DeepSpeed, nothing of launcher.tracking."""
    code = ("import sys, launcher.config.run_config, launcher.config.stages; "
            "print(sorted(m for m in sys.modules if m in ('torch', 'deepspeed') or m.startswith('launcher.tracking')))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout

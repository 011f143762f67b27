"""The direction of dependencies between the packages (setup.cfg [importlinter]) holds, and breaking
it is caught: `lint-imports` on the project, then on a copy with one import pointing the wrong way."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
CONTRACTS = 4


def _lint_imports(project: Path) -> subprocess.CompletedProcess:
    # lint-imports puts its working directory first on sys.path: it analyses the packages found there.
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=project, capture_output=True, text=True, timeout=300)


def test_the_contracts_hold():
    result = _lint_imports(REPO)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert f"Contracts: {CONTRACTS} kept, 0 broken." in result.stdout


def test_a_wrong_import_breaks_its_contract(tmp_path):
    for package in ("roformer", "data_pipeline", "launcher"):
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "setup.cfg", tmp_path / "setup.cfg")
    trainer = tmp_path / "launcher" / "train" / "trainer.py"
    trainer.write_text(trainer.read_text() + "\nfrom launcher.downstream.export import export_checkpoint  # wrong way\n")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0
    assert f"Contracts: {CONTRACTS - 1} kept, 1 broken." in result.stdout
    assert "launcher.train.trainer -> launcher.downstream.export" in result.stdout

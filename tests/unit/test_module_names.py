"""One meaning per module name: no two modules under launcher/ share a file name (a package's __init__.py and
__main__.py aside), so `run_checks.py` or `stages.py` names one thing wherever it is read, grepped or cited
(issue 62 item 2: gpu_check/run_checks.py and inputs/run_checks.py meant two things)."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from tests.support.helpers import REPO

PACKAGE_FILES = {"__init__.py", "__main__.py"}


def shared_names(root: Path) -> dict[str, list[str]]:
    """File name -> the modules under `root` that carry it, where more than one does."""
    where: dict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        if path.name not in PACKAGE_FILES and "__pycache__" not in path.parts:
            where[path.name].append(path.relative_to(root.parent).as_posix())
    return {name: paths for name, paths in where.items() if len(paths) > 1}


def test_no_two_launcher_modules_share_a_file_name():
    modules = [p for p in (REPO / "launcher").rglob("*.py") if "__pycache__" not in p.parts]
    assert len(modules) > 100  # the tree is there
    assert shared_names(REPO / "launcher") == {}


def test_a_shared_name_is_found(tmp_path):
    root = tmp_path / "launcher"
    for path in ("inputs/run_checks.py", "gpu_check/run_checks.py", "gpu_check/__init__.py", "inputs/__init__.py",
                 "train/rank.py"):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("")
    assert shared_names(root) == {"run_checks.py": ["launcher/gpu_check/run_checks.py", "launcher/inputs/run_checks.py"]}

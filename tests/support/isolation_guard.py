"""Blocks the project's packages from import in an isolated script (`python -I tests/support/X_isolated.py`).

The project is installed in editable mode, so `-I` alone does not hide it: a meta-path finder placed
first refuses every import of roformer / launcher / data_pipeline / tests. A script loads this file by
path before its other imports and calls `check_none_loaded()` at the end.
"""
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROJECT_PACKAGES = {"roformer", "launcher", "data_pipeline", "tests"}


class _BlockProjectCode:
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in PROJECT_PACKAGES:
            raise ImportError(f"project code is blocked in this process: {fullname}")
        return None


def check_none_loaded() -> None:
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in PROJECT_PACKAGES)
    if loaded:
        raise SystemExit(f"project modules were imported: {loaded}")


sys.meta_path.insert(0, _BlockProjectCode())
sys.path = [p for p in sys.path if p and os.path.abspath(p) not in (REPO_ROOT, os.path.join(REPO_ROOT, "tests"), os.path.join(REPO_ROOT, "tests", "support"))]

"""pip's index settings as uv's, which reads none of pip's: `UV_NAME=value` lines for scripts/setup.sh to export.

Read as pip reads them: a PIP_* variable first, then the config files (`pip config list`: the install section
before the global one). A UV_* variable already set is kept. Lists (pip: newline or space separated) become uv's
space-separated form.

    python scripts/uv_settings.py PIP_PYTHON    # the interpreter whose pip's configuration to read
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys

SETTINGS = {"index-url": "UV_INDEX_URL", "extra-index-url": "UV_EXTRA_INDEX_URL", "find-links": "UV_FIND_LINKS",
            "constraint": "UV_CONSTRAINT"}
"""pip's key -> uv's variable."""


def pip_config(python: str) -> dict[str, str]:
    """{section.key: value} of every config file pip loads (its own order: later files win)."""
    listed = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True)
    config = {}
    for line in listed.stdout.splitlines():
        name, sep, value = line.partition("=")
        if sep and not name.startswith(":env:"):
            config[name] = ast.literal_eval(value)
    return config


def uv_settings(python: str, environ: dict[str, str]) -> dict[str, str]:
    config = pip_config(python)
    settings = {}
    for key, uv_name in SETTINGS.items():
        if environ.get(uv_name):
            continue
        value = (environ.get("PIP_" + key.upper().replace("-", "_")) or config.get(f"install.{key}")
                 or config.get(f"global.{key}"))
        if value and value.split():
            settings[uv_name] = " ".join(value.split())
    return settings


if __name__ == "__main__":
    for name, value in uv_settings(sys.argv[1], dict(os.environ)).items():
        print(f"{name}={value}")

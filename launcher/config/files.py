"""Reading the config files of a run (run config, schedule, DeepSpeed JSON): YAML or JSON by suffix,
always a mapping, every error one line naming the file (and the line, for JSON)."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from launcher.errors import UserError


def read_mapping(path: str | Path, what: str) -> dict:
    """The mapping stored in `path` (JSON for *.json, else YAML); `what` names the file in errors."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: {what} not found") from None
    try:
        raw = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as err:
        raise UserError(f"{path}: line {err.lineno}: not valid JSON: {err.msg}") from None
    except yaml.YAMLError as err:
        raise UserError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: a {what} must be a mapping, got {type(raw).__name__}")
    return raw

"""Files that are never seen half-written, console lines never glued to another process's, file
checksums, and config files read as a mapping with one-line errors (the one copy of each).

A write goes to a hidden temporary file next to the target, is flushed to disk, and is renamed over
the target (os.replace is atomic on POSIX): a reader sees the old file or the new one, never a mix,
and a crash leaves at most a `.NAME.tmp<pid>` file behind. The directory is fsynced after the
rename, so the new file also survives a power loss (fsync helpers: data_pipeline.durable).
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, TextIO

import yaml

from data_pipeline.durable import fsync_dir, fsync_file, fsync_tree  # noqa: F401  (re-exported)
from launcher.errors import UserError


def _atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())

    _atomic_write(path, write)


def atomic_write_json(path: Path, payload: Any) -> None:
    """Indented JSON with a final newline (every JSON file of a run directory and a report)."""
    atomic_write_text(path, json.dumps(payload, indent=2) + "\n")


def atomic_torch_save(obj: Any, path: Path) -> None:
    import torch

    _atomic_write(path, lambda tmp: torch.save(obj, tmp))


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_line(text: str, stream: TextIO | None = None) -> None:
    """`text` and its newline in ONE write, flushed (default stream: stderr). The ranks of a node share
    one pipe, and under `python -u` print() writes the text and the newline separately: a peer's line
    could land between them, and a process ending between them loses the newline. One write of a line
    (below PIPE_BUF, 4 kB) reaches a pipe whole."""
    stream = sys.stderr if stream is None else stream
    stream.write(text + "\n")
    stream.flush()


def read_mapping(path: str | Path, what: str) -> dict:
    """The mapping a config file stores (run config, schedule, DeepSpeed JSON): JSON for *.json, else YAML;
    every error one line naming the file (and the line, for JSON); `what` names the file's kind."""
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

"""What a command wrote, recorded so a later command may replace it only while it is unchanged (issue 63).

    record_written(path, "eval-mlm report")   # after the write: its sha256 (a file) or every file's (a folder)
    changes = recorded_changes(path, "eval-mlm report")  # None: no record of that kind; [] unchanged; else what differs

A file F gets its record beside it, `.F.written.json`; a folder D inside it, `D/.written.json` (the same idea as
export_info.json's sha256 per file). Without a record, a file is not ours: it is named, never replaced.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

from launcher.common.io import atomic_write_json, file_sha256, read_json_object

RECORD_FORMAT = "roformer-ds-written"
DIR_RECORD = ".written.json"


def record_path(path: Path) -> Path:
    path = Path(path)
    return path / DIR_RECORD if path.is_dir() else path.with_name(f".{path.name}.written.json")


def _files(folder: Path) -> dict[str, str]:
    """Every file below `folder` (links and the record excluded), relative path -> sha256."""
    found = {}
    for here, _dirs, files in os.walk(folder):
        for name in files:
            file = Path(here) / name
            relative = file.relative_to(folder).as_posix()
            if relative != DIR_RECORD and not file.is_symlink():
                found[relative] = file_sha256(file)
    return found


def record_written(path: Path, kind: str, command: str = "", marker: bool = False) -> None:
    """Record `path` (just written by `command`) as an output of `kind`, with its sha256 (a folder: each file's;
    `marker`: none, a work folder whose files change while it is used)."""
    path = Path(path)
    sha = {} if marker else _files(path) if path.is_dir() else file_sha256(path)
    atomic_write_json(record_path(path), {"format": RECORD_FORMAT, "kind": kind, "command": command, "sha256": sha})


def forget_written(path: Path) -> None:
    """Remove a file's record (a refusal or failure after it: nothing of ours left behind)."""
    with contextlib.suppress(OSError):
        record_path(path).unlink()


def recorded_changes(path: Path, kind: str) -> list[str] | None:
    """None when `path` has no record of `kind`; else what differs from the record: [] when unchanged,
    otherwise the files added or changed since (a folder: relative names; a file: its own name)."""
    path = Path(path)
    record = read_json_object(record_path(path))
    if record.get("format") != RECORD_FORMAT or record.get("kind") != kind:
        return None
    sha = record.get("sha256")
    if path.is_dir():
        if not isinstance(sha, dict):
            return None
        return sorted(f"{name} (changed since {record.get('command') or 'we'} wrote it)" if name in sha else name
                      for name, digest in _files(path).items() if sha.get(name) != digest)
    if not isinstance(sha, str):
        return None
    return [] if path.is_file() and file_sha256(path) == sha else [path.name]

"""fsync helpers: what a power loss must not take back once a completion marker says "done".

A rename (os.replace) or a new file is durable only once its DIRECTORY is fsynced, and a file's
content only once the file is; a marker (manifest.json, sidecar.json, `latest`, export_info.json)
must reach the disk after everything it vouches for. The data pipeline and the launcher both use
these (data_pipeline imports nothing from launcher, so they live here; launcher.common.io re-exports them).
"""
from __future__ import annotations

import os
from pathlib import Path


def fsync_file(path: Path) -> None:
    """Flush one file's content and metadata (works on a read-only descriptor on Linux)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Flush a directory's entries (created, renamed or removed names inside it)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Every file and directory under `root` (children before their directory), then `root` itself."""
    root = Path(root)
    for directory, _dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames:
            fsync_file(Path(directory) / name)
        fsync_dir(Path(directory))

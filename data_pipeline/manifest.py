"""The manifest of a prepared data directory (`manifest.json`, written last: it marks the directory
complete) and the sha256 it records for every file; the shards it lists: data_pipeline/shards.py."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from data_pipeline.config import DEFAULT_SOURCE
from data_pipeline.durable import fsync_dir, fsync_tree
from data_pipeline.errors import DataError

MANIFEST = "manifest.json"
FORMAT_NAME = "roformer-ds-shards"
FORMAT_VERSION = 1
SPLITS = ("train", "valid")


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def manifest_sources(manifest: dict) -> list[dict]:
    """The named sources of a manifest: [{name, files, train: {documents, tokens}, valid: {...}}, ...].

    A manifest from before named sources (its `sources` lists input files) is one source,
    DEFAULT_SOURCE, holding every shard."""
    sources = manifest.get("sources") or []
    if sources and all(isinstance(s, dict) and "name" in s for s in sources):
        return sources
    counts = {split: {"documents": manifest["splits"].get(split, {}).get("documents", 0),
                      "tokens": manifest["splits"].get(split, {}).get("tokens", 0)} for split in SPLITS}
    return [{"name": DEFAULT_SOURCE, "files": sources, **counts}]


def read_manifest(data_dir: Path) -> dict:
    path = Path(data_dir) / MANIFEST
    if not path.is_file():
        raise DataError(f"{path}: no manifest; prepare the data with `roformer data prepare`")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: not valid JSON ({err})") from err
    if manifest.get("format") != FORMAT_NAME or manifest.get("format_version") != FORMAT_VERSION:
        raise DataError(f"{path}: format {manifest.get('format')!r} v{manifest.get('format_version')} "
                        f"is not {FORMAT_NAME} v{FORMAT_VERSION}")
    return manifest


def write_manifest(out_dir: Path, manifest: dict) -> None:
    """The completion marker: the tokenizer and every split are flushed to disk first, then the
    manifest (atomically), then the directory entry."""
    for name in ("tokenizer", *manifest.get("splits", {})):
        if (out_dir / name).is_dir():
            fsync_tree(out_dir / name)
    tmp = out_dir / f".{MANIFEST}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(manifest, indent=2, ensure_ascii=False))
        handle.flush()
        os.fsync(handle.fileno())
    fsync_dir(out_dir)
    os.replace(tmp, out_dir / MANIFEST)
    fsync_dir(out_dir)

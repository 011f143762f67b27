"""Opening an s3:// prepared-data location: its manifest, tokenizer files and .idx files into the node's
cache (once per node), and the NodeCache its shards are read through."""
from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import numpy as np

from data_pipeline.errors import DataError
from data_pipeline.manifest import read_manifest
from data_pipeline.remote.cache import NodeCache
from data_pipeline.remote.client import RemoteOptions, RemoteStore
from data_pipeline.remote.prefetch import Prefetcher
from data_pipeline.remote.url import format_size, parse_location

_OPEN: dict[tuple, "RemoteData"] = {}
_OPEN_LOCK = threading.Lock()


class RemoteData:
    """One location opened in this process: the cache, the prefetcher, the local root of its metadata."""

    def __init__(self, location: str, options: RemoteOptions):
        self.location = parse_location(location)
        self.options = options
        self.store = RemoteStore(self.location, options.retries, options.timeout)
        self.cache = NodeCache(self.store, options)
        self.prefetcher = Prefetcher(self.cache)
        self.root = self._sync_metadata()

    def _sync_metadata(self) -> Path:
        self.store.check_bucket()
        self.cache.fetch_manifest()
        manifest = read_manifest(self.cache.root)
        model = manifest["tokenizer"]["path"]
        files = self.store.list("tokenizer")
        if not any(rel == model for rel, _size, _tag in files):
            raise DataError(f"{self.store.endpoint}: {self.location.url(model)}: no such object (the manifest's "
                            f"tokenizer)")
        for rel, size, tag in files:
            self.cache.fetch_file(rel, size, manifest["tokenizer"]["sha256"] if rel == model else None, tag)
        biggest = 0
        for split, info in manifest["splits"].items():
            for entry in info["shards"]:
                self.cache.fetch_file(f"{split}/{entry['name']}.idx", (entry["documents"] + 1) * 8,
                                      entry.get("idx_sha256"))
                biggest = max(biggest, entry["tokens"] * _itemsize(manifest))
        if self.options.cache_limit and biggest > self.options.cache_limit:
            raise DataError(f"data.cache_limit {format_size(self.options.cache_limit)} is smaller than one shard of "
                            f"{self.location} ({format_size(biggest)}): raise it")
        return self.cache.root

    def shard_object(self, split: str, entry: dict, itemsize: int) -> tuple[str, int, str]:
        """(relative path, size, sha256) of a shard's token file."""
        return f"{split}/{entry['name']}.bin", entry["tokens"] * itemsize, entry["bin_sha256"]


def _itemsize(manifest: dict) -> int:
    return np.dtype(manifest["dtype"]).itemsize


def open_remote(location, options: RemoteOptions | None) -> RemoteData:
    """The location opened once per process and options (train and valid share its cache and holds)."""
    options = options or RemoteOptions()
    chain = "\0".join(os.environ.get(name, "") for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID",
                                                             "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"))
    key = (str(parse_location(location)), options, hashlib.sha256(chain.encode()).hexdigest())
    with _OPEN_LOCK:
        data = _OPEN.get(key)
        if data is None:
            data = _OPEN[key] = RemoteData(str(location), options)
        return data

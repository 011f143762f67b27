"""The node-local cache of one s3:// location: every rank of a node shares it.

Layout: CACHE_ROOT/<endpoint host>/<bucket>/<prefix>/ mirrors the objects (manifest.json, tokenizer/,
<split>/shard_NNNNN.idx and .bin). Beside each object `X`: `.X.lock` (its lock file, never removed),
`.X.ok` (the sha256 it was verified against; its mtime is the last use, for LRU) and, while it
downloads, `.X.part`.

- One download per object per node: the downloader holds an exclusive flock on `.X.lock`; a reader
  holds a shared one for as long as it maps X. A shard's exclusive lock is only ever tried (LOCK_NB), never
  waited for: a reader may hold its shared one across a collective that waits for the process wanting it.
  flock belongs to the open file, so the kernel drops it when its process dies: a killed download leaves a
  `.part` the next taker starts over, never a lock.
- Every object is checked against the manifest's sha256 before it is renamed into place; a mismatch
  is a DataError naming the object, and nothing of it stays.
- data.cache_limit bounds the shard bytes (token files) of the whole cache root, all locations together
  (the manifest, tokenizer and .idx files, a few bytes per document, are kept beside them): room is made under one flock of CACHE_ROOT/.space.lock by evicting the least recently
  used shard whose lock nobody holds (a try-lock), and a download's `.part` is sized to the object
  before its first byte, so the bytes on disk never pass the limit.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import random
import re
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

from data_pipeline.errors import DataError
from data_pipeline.manifest import file_sha256
from data_pipeline.remote.client import MissingObject, RemoteOptions, RemoteStore
from data_pipeline.remote.url import format_size

ROOM_WAIT_S = 120.0
"""How long a shard that the limit has no room for waits for other readers to release theirs."""


def _side(path: Path, kind: str) -> Path:
    return path.with_name(f".{path.name}.{kind}")


def cache_usage(root: Path) -> int:
    """Shard bytes held under a cache root: token files and downloads in progress (at their full size).
    The metadata read once per node (manifest, tokenizer, .idx: bytes per document) is not counted."""
    total = 0
    for directory, _dirs, files in os.walk(root):
        for name in files:
            if not (name.endswith(".bin") or name.endswith(".bin.part")):
                continue
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(directory, name)).st_size
    return total


CACHE_MARKER = ".roformer-ds-cache"
"""Marks a directory as a cache: eviction deletes files in it, so it must not be the user's other files."""
SPACE_LOCK = ".space.lock"
"""Held while room is made or the shard bytes are counted (one consistent moment for every rank)."""


def settled_cache_usage(cache_root: Path) -> int:
    """cache_usage under the cache's space lock: every byte a cache adds is reserved under it, so this is one
    consistent moment (a walk without it may count a file of one directory before an eviction and a new one of
    another directory after it)."""
    with _flocked(Path(cache_root) / SPACE_LOCK):
        return cache_usage(cache_root)


def claim_cache_root(root: Path) -> None:
    """`root` as a cache: new, empty, or marked as one already; DataError naming data.cache_dir otherwise."""
    if (root / CACHE_MARKER).is_file():
        return
    if root.exists() and (not root.is_dir() or any(p.name != SPACE_LOCK for p in root.iterdir())):
        raise DataError(f"data.cache_dir {root}: {'not a directory' if not root.is_dir() else 'not empty'} and not a "
                        f"cache of ours (no {CACHE_MARKER}); its files could be evicted: name a new or empty directory")
    root.mkdir(parents=True, exist_ok=True)
    (root / CACHE_MARKER).touch()


class NodeCache:
    """Objects of one location in the node-local cache. Thread-safe within a process."""

    def __init__(self, store: RemoteStore, options: RemoteOptions):
        self.store, self.options = store, options
        self.cache_root = options.cache_root
        claim_cache_root(self.cache_root)
        host = re.sub(r"[^A-Za-z0-9._-]", "_", urlparse(store.endpoint).netloc or "default")
        location = store.location
        self.root = self.cache_root / host / location.bucket / location.prefix
        self.limit = options.cache_limit
        self._mutex = threading.Lock()
        self._held: dict[str, list] = {}  # relative path -> [lock fd, holders in this process]

    # --- small objects read once per node: manifest, tokenizer files, .idx --------------------------

    def fetch_manifest(self) -> Path:
        """manifest.json, fetched again at every open (a re-upload changes it) and replaced when it differs."""
        path = self.root / "manifest.json"
        try:
            data = self.store.read_bytes("manifest.json", "manifest")
        except MissingObject:
            raise DataError(f"{self.store.endpoint}: {self.store.location.url('manifest.json')}: no manifest at "
                            f"this prefix (a missing prefix, or an upload that has not finished: `roformer data "
                            f"upload` writes it last)") from None
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_bytes() != data:
            self._write_whole(path, data)
        return path

    def fetch_file(self, relative: str, size: int, sha256: str | None, etag: str | None = None) -> Path:
        """A metadata object (tokenizer file, .idx) into the cache once per node; checked against sha256
        when the manifest has one, else known by its ETag. Not evicted, not held."""
        with self._object_lock(relative):
            path = self.root / relative
            if self._is_verified(path, size, sha256, tag=etag):
                return path
            self._download(relative, path, size, sha256, make_room=False, tag=etag)
        return path

    # --- shards: held while mapped, bounded by the limit --------------------------------------------

    def acquire(self, relative: str, size: int, sha256: str) -> Path:
        """The verified local copy of a shard, held (not evicted) until release(relative)."""
        with self._mutex:
            held = self._held.get(relative)
            if held is not None:
                held[1] += 1
                return self.root / relative
        path = self.root / relative
        fd = self._open_lock(relative)
        try:
            while True:
                fcntl.flock(fd, fcntl.LOCK_SH)  # readers share; waits only while a download holds it alone
                if self._is_verified(path, size, sha256, rehash=False):
                    break
                # Never wait for the lock alone: a peer rank may hold it shared on a copy made meanwhile (its
                # prefetch) while it waits in a collective for this rank. Let go, try, and look again.
                fcntl.flock(fd, fcntl.LOCK_UN)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    time.sleep(random.uniform(0.01, 0.05))  # apart from a peer trying the same
                    continue
                if not self._is_verified(path, size, sha256):
                    self._download(relative, path, size, sha256, make_room=True)
                fcntl.flock(fd, fcntl.LOCK_SH)  # not atomic: an evictor may have taken it in between
                if self._is_verified(path, size, sha256, rehash=False):
                    break
        except BaseException:
            os.close(fd)
            raise
        _touch(_side(path, "ok"))
        with self._mutex:
            held = self._held.setdefault(relative, [fd, 0])
            if held[0] != fd:  # another thread of this process got there first
                os.close(fd)
            held[1] += 1
        return path

    def release(self, relative: str) -> None:
        with self._mutex:
            held = self._held.get(relative)
            if held is None:
                return
            held[1] -= 1
            if held[1] <= 0:
                os.close(held[0])
                del self._held[relative]

    def prefetch(self, relative: str, size: int, sha256: str) -> bool:
        """Download a shard ahead of its use unless present, being downloaded, or without room now
        (a prefetch never waits and never evicts a shard in use). True when it is in the cache."""
        path = self.root / relative
        if self._is_verified(path, size, sha256, rehash=False):
            return True
        fd = self._open_lock(relative)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        try:
            if self._is_verified(path, size, sha256):
                return True
            try:
                self._download(relative, path, size, sha256, make_room=True, wait=False)
            except _NoRoom:
                return False
            return True
        finally:
            os.close(fd)

    # --- internals ------------------------------------------------------------------------------------

    def _open_lock(self, relative: str) -> int:
        lock = _side(self.root / relative, "lock")
        lock.parent.mkdir(parents=True, exist_ok=True)
        return os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)

    def _object_lock(self, relative: str):
        return _flocked(_side(self.root / relative, "lock"))

    def _is_verified(self, path: Path, size: int, sha256: str | None, rehash: bool = True,
                     tag: str | None = None) -> bool:
        """The copy is whole and was checked: its marker names this sha256 (or the object's ETag, when there
        is no sha256). A copy without its marker (a stop between rename and marker) is hashed again."""
        try:
            if path.stat().st_size != size:
                return False
        except FileNotFoundError:
            return False
        marker = _side(path, "ok")
        want = sha256 or f"etag:{tag}"
        try:
            if marker.read_text().strip() == want:
                return True
        except FileNotFoundError:
            pass
        if not rehash or sha256 is None:
            return False
        if file_sha256(path) == sha256:
            marker.write_text(want)
            return True
        return False

    def _download(self, relative: str, path: Path, size: int, sha256: str | None, make_room: bool,
                  wait: bool = True, tag: str | None = None) -> None:
        """Fetch the object into `.X.part`, check it, rename it into place (caller holds its lock)."""
        part = _side(path, "part")
        path.parent.mkdir(parents=True, exist_ok=True)
        _side(path, "ok").unlink(missing_ok=True)
        path.unlink(missing_ok=True)
        if make_room and self.limit:
            self._reserve(part, size, relative, wait)
        with open(part, "r+b" if part.exists() else "w+b") as handle:
            got = self.store.download(relative, handle, f"GET {'shard' if make_room else 'object'}", size,
                                      notify=make_room)
            if handle.tell() != size:
                handle.close()
                part.unlink(missing_ok=True)
                raise DataError(f"{self.store.endpoint}: {self.store.location.url(relative)}: {handle.tell()} bytes, "
                                f"the manifest says {size} (a replaced object, or a manifest of other data)")
            os.fsync(handle.fileno())
        if sha256 is not None and got != sha256:
            part.unlink(missing_ok=True)
            raise DataError(f"{self.store.endpoint}: {self.store.location.url(relative)}: sha256 {got[:12]} does not "
                            f"match the manifest's {sha256[:12]} (a corrupted or replaced object; not used)")
        os.replace(part, path)
        _side(path, "ok").write_text(sha256 or f"etag:{tag}")

    def _reserve(self, part: Path, size: int, relative: str, wait: bool) -> None:
        """Room for `size` bytes under the limit, then `.part` at that size (counted from now on)."""
        if size > self.limit:
            raise DataError(f"data.cache_limit {format_size(self.limit)} is smaller than one shard: "
                            f"{self.store.location.url(relative)} has {format_size(size)}")
        deadline = time.monotonic() + ROOM_WAIT_S
        while True:
            with _flocked(self.cache_root / SPACE_LOCK):
                if self._evict_until(self.limit - size):
                    with open(part, "wb") as handle:
                        handle.truncate(size)
                    return
                in_use = cache_usage(self.cache_root)
            if not wait:
                raise _NoRoom()
            if time.monotonic() > deadline:
                raise DataError(f"data.cache_limit {format_size(self.limit)}: no room for "
                                f"{self.store.location.url(relative)} ({format_size(size)}) beside "
                                f"{format_size(in_use)} of shards in use on this node for {ROOM_WAIT_S:.0f} s: raise "
                                f"data.cache_limit (data.order shard_window needs two windows of shards)")
            time.sleep(0.2)

    def _evict_until(self, target: int) -> bool:
        """Evict unheld shards, least recently used first, until the cache holds <= target bytes."""
        usage = cache_usage(self.cache_root)
        if usage <= target:
            return True
        candidates = []
        for directory, _dirs, files in os.walk(self.cache_root):
            for name in files:
                if name.endswith(".bin") or (name.endswith(".part") and name.startswith(".")):
                    path = Path(directory) / name
                    marker = _side(path, "ok")
                    with contextlib.suppress(FileNotFoundError):
                        used = marker.stat().st_mtime if marker.exists() else 0.0
                        candidates.append((used, path))
        for _used, path in sorted(candidates):
            obj = path.with_name(path.name[1:-len(".part")]) if path.name.endswith(".part") else path
            fd = os.open(_side(obj, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a reader holds it, or its download is under way
                with contextlib.suppress(FileNotFoundError):
                    freed = path.stat().st_size
                    _side(obj, "ok").unlink(missing_ok=True)
                    path.unlink()
                    usage -= freed
            finally:
                os.close(fd)
            if usage <= target:
                return True
        return usage <= target

    @staticmethod
    def _write_whole(path: Path, data: bytes) -> None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)


class _NoRoom(Exception):
    """A prefetch found no room now (it never waits)."""


@contextlib.contextmanager
def _flocked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _touch(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.utime(path)

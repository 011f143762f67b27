"""A background thread that fetches the shards the next steps need into the node-local cache.

The reader says which shards come next (`want`); the thread downloads them one by one, skipping those
already cached or being fetched by another rank, and never waits for room: a shard it could not fetch
is fetched on demand by the reader, whose errors are the ones a user sees.
"""
from __future__ import annotations

import threading

from data_pipeline.errors import DataError


class Prefetcher:
    def __init__(self, cache):
        self.cache = cache
        self._wanted: list[tuple[str, int, str]] = []
        self._done: set[str] = set()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def want(self, objects: list[tuple[str, int, str]], first: bool = False) -> None:
        """(relative path, size, sha256) of shards needed soon, in order: after those already wished for,
        or before them (`first`: the next window of a shard_window stream)."""
        with self._wake:
            new = [o for o in objects if o[0] not in self._done]
            names = {o[0] for o in new}
            rest = [o for o in self._wanted if o[0] not in names]
            self._wanted = new + rest if first else rest + new
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="roformer-prefetch", daemon=True)
                self._thread.start()
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._wanted:
                    self._wake.wait()
                relative, size, sha256 = self._wanted.pop(0)
            try:
                fetched = self.cache.prefetch(relative, size, sha256)
            except (DataError, OSError):
                fetched = False  # the reader's own fetch of it reports the error
            if fetched:
                with self._wake:
                    self._done.add(relative)

"""Pre-tokenized shards (Megatron-style indexed arrays) and the manifest that describes them.

A shard is two files in `<data_dir>/<split>/`:
  shard_XXXXX.bin  token ids of all its documents back to back (uint16 if vocab < 65536, else uint32)
  shard_XXXXX.idx  int64 document offsets into .bin, length documents + 1 (offsets[0] = 0)
so document d, token t is element offsets[d] + t of a memory map: O(1) seek, nothing read before it.
`manifest.json` lists every shard with document/token counts, sha256 and modification time
(`bin_mtime_ns`, `idx_mtime_ns`) of both files, plus the tokenizer hash, sources and options;
`open_corpus` checks all of it and names the bad shard.

Named sources: every shard holds the documents of one source (its manifest entry's `source`; absent in
manifests from before named sources, which hold the one source DEFAULT_SOURCE), and the manifest's
`sources` lists each source's name, files and documents/tokens per split (`manifest_sources`; the
manifest's reader and writer: data_pipeline/manifest.py).

Hash once: the shards are hashed when they are written. `open_corpus(verify=True)` re-hashes only a
shard whose size or mtime differs from the manifest's (replaced, rewritten, copied without keeping
times, or a manifest from before the times were recorded); an unchanged shard costs two stat calls.
Shards and the tokenizer are fsynced before the manifest, written last, marks the directory complete.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from data_pipeline.config import DEFAULT_SOURCE
from data_pipeline.errors import DataError
from data_pipeline.manifest import MANIFEST, file_sha256, manifest_sources, read_manifest
from data_pipeline.remote.dataset import open_remote
from data_pipeline.remote.url import is_remote
from data_pipeline.special_ids import SpecialIds
from data_pipeline.tokenizer import open_tokenizer, resolve_model_path, tokenizer_hash, word_start_table

def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size < 65536 else np.dtype(np.uint32)


class ShardWriter:
    """Appends tokenized documents to `<directory>/<stem>_NNN.bin/.idx`, rolling over at a token budget.

    Offsets of the open shard are kept in memory (8 bytes per document of one shard only);
    tokens stream to disk. Empty shards are never written. A finished shard is on disk (fsync) and
    its entry records both files' mtimes, which `open_corpus` compares instead of re-hashing.
    """

    def __init__(self, directory: Path, stem: str, dtype: np.dtype, shard_tokens: int):
        self.directory, self.stem, self.dtype, self.shard_tokens = directory, stem, dtype, shard_tokens
        directory.mkdir(parents=True, exist_ok=True)
        self.finished: list[dict] = []
        self._file = None

    def add(self, ids: np.ndarray) -> None:
        if len(ids) == 0:
            return
        if self._file is None:
            self._open()
        self._file.write(np.asarray(ids, dtype=self.dtype).tobytes())
        self._offsets.append(self._offsets[-1] + len(ids))
        if self._offsets[-1] >= self.shard_tokens:
            self._close()

    def close(self) -> list[dict]:
        if self._file is not None:
            self._close()
        return self.finished

    def _open(self) -> None:
        self._name = f"{self.stem}_{len(self.finished):03d}"
        self._file = open(self.directory / f"{self._name}.bin", "wb")
        self._offsets = [0]

    def _close(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        bin_path, idx_path = self.directory / f"{self._name}.bin", self.directory / f"{self._name}.idx"
        with open(idx_path, "wb") as handle:
            handle.write(np.asarray(self._offsets, dtype=np.int64).tobytes())
            handle.flush()
            os.fsync(handle.fileno())
        self.finished.append({"name": self._name, "documents": len(self._offsets) - 1,
                              "tokens": int(self._offsets[-1]), "bin_mtime_ns": bin_path.stat().st_mtime_ns,
                              "idx_mtime_ns": idx_path.stat().st_mtime_ns})


@dataclass
class Shard:
    """One shard of a split, memory-mapped on first use."""

    path: Path
    """Path without extension: `<data_dir>/<split>/shard_00000`."""
    documents: int
    tokens: int
    dtype: np.dtype
    source: str = DEFAULT_SOURCE
    """Name of the source whose documents the shard holds."""
    remote: tuple | None = None
    """(RemoteData, relative path, size, sha256) of its token file in object storage; None: local."""

    def __post_init__(self) -> None:
        self._tokens_map = None
        self._offsets_map = None

    @property
    def token_ids(self) -> np.ndarray:
        if self._tokens_map is None:
            path = self.path.with_suffix(".bin")
            if self.remote is not None:  # held in the node's cache until release()
                data, relative, size, sha256 = self.remote
                path = data.cache.acquire(relative, size, sha256)
            self._tokens_map = np.memmap(path, dtype=self.dtype, mode="r")
        return self._tokens_map

    @property
    def is_mapped(self) -> bool:
        return self._tokens_map is not None

    def release(self) -> None:
        """Unmap the token file; a remote shard's cached copy may then be evicted."""
        if self._tokens_map is None:
            return
        self._tokens_map = None
        if self.remote is not None:
            self.remote[0].cache.release(self.remote[1])

    @property
    def remote_object(self) -> tuple[str, int, str] | None:
        return None if self.remote is None else self.remote[1:]

    @property
    def offsets(self) -> np.ndarray:
        if self._offsets_map is None:
            self._offsets_map = np.memmap(self.path.with_suffix(".idx"), dtype=np.int64, mode="r")
        return self._offsets_map

    def __getstate__(self):  # memory maps and cache holds are reopened in another process, never pickled
        return {k: v for k, v in self.__dict__.items() if not k.endswith("_map") and k != "remote"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._tokens_map = self._offsets_map = self.remote = None


@dataclass
class Corpus:
    """A verified split of a prepared data directory."""

    data_dir: Path
    split: str
    shards: list[Shard]
    vocab_size: int
    tokenizer_sha256: str
    manifest: dict
    location: str = ""
    """Where the data lives: data_dir, or the s3:// location whose cached copy data_dir is."""

    @property
    def documents(self) -> int:
        return sum(s.documents for s in self.shards)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    @property
    def fingerprint(self) -> str:
        """Identifies the exact stream content, for checking a resumed reader's state."""
        parts = [self.split, self.tokenizer_sha256] + [f"{s.path.name}:{s.documents}:{s.tokens}"
                                                      for s in self.shards]
        return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]

    @property
    def source_names(self) -> list[str]:
        """Every source of the prepared data, in manifest order (also those without shards in this split)."""
        return [source["name"] for source in manifest_sources(self.manifest)]

    def source_corpus(self, name: str) -> "Corpus":
        """This split restricted to one source's shards (none when the source has no documents in it)."""
        if name not in self.source_names:
            raise DataError(f"{self.data_dir / MANIFEST}: no source {name!r} (has {', '.join(self.source_names)})")
        return Corpus(self.data_dir, self.split, [s for s in self.shards if s.source == name], self.vocab_size,
                      self.tokenizer_sha256, self.manifest, self.location)

    @property
    def remote(self):
        """The RemoteData its shards are read through (data_pipeline/remote), or None for local data."""
        return next((s.remote[0] for s in self.shards if s.remote is not None), None)

    @property
    def token_bytes(self) -> int:
        return sum(s.tokens * s.dtype.itemsize for s in self.shards)

    @property
    def special_ids(self) -> SpecialIds:
        """The tokenizer's special ids recorded in the manifest (fixed 0-4 for older manifests)."""
        return SpecialIds.from_manifest(self.manifest, str(self.data_dir / MANIFEST))

    def word_starts(self) -> np.ndarray:
        """(V,) bool table for whole-word masking (see tokenizer.word_start_table)."""
        return word_start_table(open_tokenizer(resolve_model_path(self.data_dir / "tokenizer")))


def open_corpus(data_dir: Path | str, split: str = "train", verify: bool = True,
                expected_tokenizer_sha256: str | None = None, remote_options=None) -> Corpus:
    """Open one split; checks shard structure always, and content when `verify`: sha256 of every
    shard whose size or mtime is not the one recorded at prepare time (see the module docstring).

    `expected_tokenizer_sha256` is the run's tokenizer (e.g. `tokenizer_hash(spm.model)`); the
    shards must have been built with it. Every failure raises DataError naming the file.
    An s3://BUCKET/PREFIX location is read through the node-local cache (data_pipeline/remote,
    `remote_options` a RemoteOptions): manifest, tokenizer and .idx files now, each shard's tokens when
    first read, every object checked against the manifest's sha256 whatever `verify` says.
    """
    (corpus,) = open_corpora(data_dir, (split,), verify, expected_tokenizer_sha256, remote_options)
    return corpus


def open_corpora(data_dir: Path | str, splits: tuple[str, ...] = ("train", "valid"), verify: bool = True,
                 expected_tokenizer_sha256: str | None = None, remote_options=None) -> tuple[Corpus, ...]:
    """Several splits of one prepared directory (open_corpus's checks), its manifest read and its tokenizer
    hashed once for all of them: a rank opens train and valid at every start."""
    location, remote = str(data_dir), None
    if is_remote(data_dir):
        remote = open_remote(data_dir, remote_options)
        data_dir, location = remote.root, str(remote.location)
    data_dir = Path(data_dir)
    manifest = read_manifest(data_dir)
    for split in splits:
        if split not in manifest["splits"]:
            raise DataError(f"{data_dir / MANIFEST}: no split {split!r} (has {sorted(manifest['splits'])})")
    tok = manifest["tokenizer"]
    model_path = resolve_model_path(data_dir / "tokenizer")
    actual = tokenizer_hash(model_path)
    if actual != tok["sha256"]:
        raise DataError(f"{model_path}: tokenizer sha256 {actual[:12]} does not match the manifest's "
                        f"{tok['sha256'][:12]} (shards were built with another tokenizer)")
    if expected_tokenizer_sha256 is not None and expected_tokenizer_sha256 != tok["sha256"]:
        raise DataError(f"{data_dir / MANIFEST}: shards were built with tokenizer {tok['sha256'][:12]}, "
                        f"the run uses {expected_tokenizer_sha256[:12]}")
    SpecialIds.from_manifest(manifest, str(data_dir / MANIFEST)).check_vocabulary(
        tok["vocab_size"], str(data_dir / MANIFEST))
    return tuple(_open_split(data_dir, split, manifest, remote, location, verify) for split in splits)


def _open_split(data_dir: Path, split: str, manifest: dict, remote, location: str, verify: bool) -> Corpus:
    """One split of a directory whose manifest and tokenizer open_corpora checked."""
    dtype = np.dtype(manifest["dtype"])
    shards = []
    for entry in manifest["splits"][split]["shards"]:
        shard = Shard(data_dir / split / entry["name"], entry["documents"], entry["tokens"], dtype,
                      entry.get("source", DEFAULT_SOURCE),
                      None if remote is None else (remote, *remote.shard_object(split, entry, dtype.itemsize)))
        _check_shard(shard, entry, verify)
        shards.append(shard)
    if not shards:
        fraction = manifest.get("options", {}).get("cleaning", {}).get("valid_fraction")
        if split == "valid" and fraction == 0:
            raise DataError(f"{data_dir / MANIFEST}: no validation split (prepared with --valid-fraction 0), and "
                            f"pretraining validates on it: prepare the data again with --valid-fraction > 0 "
                            f"(default 0.01)")
        raise DataError(f"{data_dir / split}: split {split!r} has no shards (corpus too small for it?)")
    tok = manifest["tokenizer"]
    return Corpus(data_dir, split, shards, tok["vocab_size"], tok["sha256"], manifest, location)


def _check_shard(shard: Shard, entry: dict, verify: bool) -> None:
    """Sizes and offsets always, content when `verify`; a remote shard's token file is checked (sha256)
    when it is downloaded, and its .idx was when it came into the cache."""
    bin_path, idx_path = shard.path.with_suffix(".bin"), shard.path.with_suffix(".idx")
    for p in (idx_path,) if shard.remote else (bin_path, idx_path):
        if not p.is_file():
            raise DataError(f"{p}: shard file listed in the manifest is missing")
    if shard.documents < 1 or shard.tokens < 1:
        raise DataError(f"{bin_path}: empty shard (documents={shard.documents}, tokens={shard.tokens})")
    if shard.remote is None and bin_path.stat().st_size != shard.tokens * shard.dtype.itemsize:
        raise DataError(f"{bin_path}: size {bin_path.stat().st_size} bytes does not match the manifest's "
                        f"{shard.tokens} tokens of {shard.dtype}")
    if idx_path.stat().st_size != (shard.documents + 1) * 8:
        raise DataError(f"{idx_path}: size does not match the manifest's {shard.documents} documents")
    offsets = shard.offsets
    if offsets[0] != 0 or offsets[-1] != shard.tokens:
        raise DataError(f"{idx_path}: offsets do not span the shard's {shard.tokens} tokens")
    if verify and shard.remote is None:
        for p, key in ((bin_path, "bin"), (idx_path, "idx")):
            if p.stat().st_mtime_ns == entry.get(f"{key}_mtime_ns"):
                continue  # hashed when written, untouched since (sizes were checked above)
            if file_sha256(p) != entry[f"{key}_sha256"]:
                raise DataError(f"{p}: sha256 does not match the manifest (corrupted or replaced shard)")

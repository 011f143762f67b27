"""`roformer data upload DIR s3://BUCKET/PREFIX`: a prepared directory to object storage, resumably.

Every file goes up with its sha256 as object metadata (`x-amz-meta-sha256`, the manifest's for shards),
so a second upload skips each object whose size and sha256 already match (an interrupted upload
resumes where it stopped). The manifest is the commit mark, as on disk: an existing one that differs
is deleted first, and the new one goes up last, once every object it names is there. Files above
`multipart_bytes` go up in parts (boto3's TransferConfig).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from data_pipeline.errors import DataError
from data_pipeline.manifest import MANIFEST, file_sha256, read_manifest
from data_pipeline.remote.client import RemoteStore
from data_pipeline.remote.url import S3Location, format_size, parse_location

MULTIPART_BYTES = 64 << 20


@dataclass
class UploadReport:
    location: str
    uploaded: int
    skipped: int
    uploaded_bytes: int
    seconds: float

    def summary(self) -> str:
        return (f"uploaded to {self.location} in {self.seconds:.1f}s: {self.uploaded} objects "
                f"({format_size(self.uploaded_bytes)}), {self.skipped} already there (same size and sha256), "
                f"manifest.json last")


def _local_files(data_dir: Path) -> list[Path]:
    """The prepared directory's files (not the manifest, not hidden work files such as .partial-*)."""
    return sorted(p for p in data_dir.rglob("*") if p.is_file() and p.name != "manifest.json"
                  and not any(part.startswith(".") for part in p.relative_to(data_dir).parts))


def _known_sha256(manifest: dict) -> dict[str, str]:
    known = {}
    for split, info in manifest["splits"].items():
        for entry in info["shards"]:
            for ext in ("bin", "idx"):
                if f"{ext}_sha256" in entry:
                    known[f"{split}/{entry['name']}.{ext}"] = entry[f"{ext}_sha256"]
    return known


def upload_directory(data_dir: Path, location: str, retries: int = 5, timeout: float = 30.0,
                     multipart_bytes: int = MULTIPART_BYTES, log=None, overwrite: bool = False) -> UploadReport:
    """`data_dir` to `location`; a location holding other prepared data (another manifest) only with `overwrite`."""
    from boto3.s3.transfer import TransferConfig


    started = time.perf_counter()
    data_dir = Path(data_dir)
    manifest = read_manifest(data_dir)  # only prepared data goes up
    target = parse_location(location, "destination")
    store = RemoteStore(target, retries, timeout)
    store.check_bucket()
    refuse_inside_prepared_data(store, "destination")
    transfer = TransferConfig(multipart_threshold=multipart_bytes, multipart_chunksize=max(5 << 20, multipart_bytes))
    known = _known_sha256(manifest)
    manifest_sha = file_sha256(data_dir / MANIFEST)
    existing = store.head(MANIFEST)
    if existing is not None and existing["sha256"] != manifest_sha:
        if not overwrite:
            raise DataError(f"{target.url(MANIFEST)}: the location holds other prepared data (its manifest differs "
                            f"from {data_dir / MANIFEST}); use --overwrite to replace it")
        store.delete(MANIFEST)  # the prefix is unfinished until the new manifest is up
    uploaded = skipped = uploaded_bytes = 0
    for path in [*_local_files(data_dir), data_dir / MANIFEST]:
        relative = path.relative_to(data_dir).as_posix()
        size = path.stat().st_size
        sha256 = manifest_sha if relative == MANIFEST else known.get(relative) or file_sha256(path)
        there = existing if relative == MANIFEST else store.head(relative)
        if there is not None and there["size"] == size and there["sha256"] == sha256:
            skipped += 1
            continue
        if relative != MANIFEST and relative in known and file_sha256(path) != sha256:
            raise DataError(f"{path}: sha256 does not match {data_dir / MANIFEST} (a corrupted shard is not uploaded)")
        store.upload_file(path, relative, sha256, transfer)
        uploaded, uploaded_bytes = uploaded + 1, uploaded_bytes + size
        if log:
            log(f"upload: {relative} ({format_size(size)})")
    return UploadReport(str(target), uploaded, skipped, uploaded_bytes, time.perf_counter() - started)


def remote_manifest_exists(location: str, retries: int = 5, timeout: float = 30.0) -> bool:
    store = RemoteStore(parse_location(location, "--out"), retries, timeout)
    store.check_bucket()
    refuse_inside_prepared_data(store, "--out")
    return store.head("manifest.json") is not None


def refuse_inside_prepared_data(store: RemoteStore, where: str) -> None:
    """DataError when a prefix above the store's location holds prepared data (its manifest.json): objects
    written under it would mix with that data set's shards (`s3://b/p1/train` is p1's train split)."""
    parts = store.location.prefix.split("/") if store.location.prefix else []
    for depth in range(len(parts)):
        above = RemoteStore(S3Location(store.location.bucket, "/".join(parts[:depth])), store.retries, store.timeout)
        if above.head("manifest.json") is not None:
            raise DataError(f"{where} {store.location}: inside the prepared data at {above.location} (it has a "
                            f"manifest.json): choose a prefix outside it")

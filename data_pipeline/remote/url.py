"""`s3://BUCKET/PREFIX` locations and byte sizes such as `2GB` (pure: no boto3, no I/O)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from data_pipeline.errors import DataError

SCHEME = "s3://"
# "s3://b/p" reaches a program as "s3:/b/p" once it went through pathlib.Path.
_S3 = re.compile(r"^s3:/+", re.IGNORECASE)
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "p": 10**15, "pb": 10**15, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40, "pib": 2**50, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40, "pi": 2**50}


def is_remote(location) -> bool:
    """True for an s3:// location (also in the `s3:/b/p` form pathlib leaves of it)."""
    return location is not None and bool(_S3.match(str(location)))


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str
    """Without leading or trailing '/'; '' is the bucket's root."""

    def key(self, relative: str) -> str:
        return f"{self.prefix}/{relative}" if self.prefix else relative

    def url(self, relative: str = "") -> str:
        key = self.key(relative) if relative else self.prefix
        return f"{SCHEME}{self.bucket}/{key}" if key else f"{SCHEME}{self.bucket}"

    def __str__(self) -> str:
        return self.url()


def parse_location(location, where: str = "data.data_dir") -> S3Location:
    """S3Location of `s3://BUCKET/PREFIX`; DataError naming `where` for anything else."""
    text = str(location)
    if not is_remote(text):
        raise DataError(f"{where}: {text} is not an s3://BUCKET/PREFIX location")
    rest = _S3.sub("", text)
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise DataError(f"{where}: {text}: no bucket (expected s3://BUCKET/PREFIX)")
    if not _BUCKET.match(bucket):
        raise DataError(f"{where}: {text}: {bucket!r} is not a bucket name (3-63 lower-case letters, digits, '.', '-')")
    prefix = "/".join(part for part in prefix.split("/") if part)
    if any(part in (".", "..") for part in prefix.split("/")):
        raise DataError(f"{where}: {text}: '.' and '..' are not key parts")
    return S3Location(bucket, prefix)


def parse_size(value, where: str) -> int:
    """Bytes of `2GB`, `512MiB`, `1.5G` or a plain integer; 0 means no limit. DataError naming `where`."""
    if isinstance(value, bool):
        raise DataError(f"{where}: expected a size such as 2GB or a number of bytes, got {value!r}")
    if isinstance(value, int):
        number, unit = value, ""
    else:
        match = _SIZE.match(str(value)) if value is not None else None
        if not match:
            raise DataError(f"{where}: expected a size such as 2GB, 512MiB or a number of bytes, got {value!r}")
        number, unit = float(match.group(1)), match.group(2).lower()
        if unit not in _UNITS:
            raise DataError(f"{where}: unknown unit {match.group(2)!r} in {value!r} (B, KB, MB, GB, TB, KiB, MiB, GiB)")
    if number < 0:
        raise DataError(f"{where}: {value!r} must be >= 0")
    return int(number * _UNITS[unit])


def format_size(size: int) -> str:
    for unit, factor in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if size >= factor:
            return f"{size / factor:.2f} {unit}"
    return f"{size} B"

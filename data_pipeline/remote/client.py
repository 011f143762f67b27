"""The boto3 S3 client of a location, with timeouts and our own bounded retries; errors as one line.

Endpoint and credentials come from boto3's standard chain (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID /
AWS_SECRET_ACCESS_KEY, AWS_PROFILE, instance roles, ...); nothing here prints or stores them.
botocore's own retries are off (one attempt per call) so `retries` is the only count: a connection
error, a timeout or a 5xx / throttling answer is retried with exponential backoff, any other answer
(no such bucket or key, refused credentials) fails at once. Every failure is a DataError naming the
endpoint and the object.
"""
from __future__ import annotations

import hashlib
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, TypeVar

from data_pipeline.errors import DataError
from data_pipeline.remote.url import parse_size
from data_pipeline.remote.url import S3Location

T = TypeVar("T")
BACKOFF_S = 0.5
BACKOFF_MAX_S = 8.0
CHUNK = 1 << 20
_AUTH_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken", "ExpiredToken",
               "403", "AuthorizationHeaderMalformed"}
_RETRY_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "InternalError",
                "ServiceUnavailable", "RequestTimeTooSkewed"}


@dataclass(frozen=True)
class RemoteOptions:
    """How a run reaches object storage (the run config's data.cache_dir, cache_limit, remote_retries,
    remote_timeout)."""

    cache_dir: str = ""
    """'' = ~/.cache/roformer-ds/remote."""
    cache_limit: int = 0
    """Bytes the cache may hold; 0 = no limit."""
    retries: int = 5
    timeout: float = 30.0

    @classmethod
    def from_data_section(cls, data: dict) -> "RemoteOptions":
        """From a run config's `data` mapping as written in a run directory (its defaults where absent)."""
        return cls(cache_dir=str(data.get("cache_dir") or ""),
                   cache_limit=parse_size(data.get("cache_limit") or 0, "data.cache_limit"),
                   retries=int(data.get("remote_retries", cls.retries)), timeout=float(data.get("remote_timeout", cls.timeout)))

    @property
    def cache_root(self) -> Path:
        return Path(os.path.expanduser(self.cache_dir or "~/.cache/roformer-ds/remote"))


ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
"""Where botocore takes the S3 endpoint from, first match wins (else the AWS config file's endpoint_url)."""


def _bad_endpoint(location: S3Location, reason: str) -> str:
    setting = next((f"{name}={os.environ[name]!r}" for name in ENDPOINT_VARIABLES if os.environ.get(name)),
                   "the endpoint_url of the AWS config file")
    return f"{location}: {setting} is not an endpoint URL ({reason}): expected http(s)://HOST[:PORT]"


def _check_endpoint(location: S3Location, endpoint: str) -> None:
    """The scheme, host and port botocore would only trip over at the first request (EndpointResolutionError,
    or a ValueError from the HTTP library), checked when the client is made."""
    from urllib.parse import urlsplit

    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https"):
        raise DataError(_bad_endpoint(location, f"scheme {parts.scheme or 'none'!r}"))
    try:
        parts.port
    except ValueError:
        raise DataError(_bad_endpoint(location, f"port {parts.netloc.rpartition(':')[2]!r} out of 0-65535")) from None
    if not parts.hostname:
        raise DataError(_bad_endpoint(location, "no host"))


class MissingObject(DataError):
    """No object at that key (the caller says what it means: no manifest, a missing shard)."""


class RemoteStore:
    """Reads and writes the objects under one s3:// location."""

    def __init__(self, location: S3Location, retries: int = 5, timeout: float = 30.0):
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError

        self.location, self.retries, self.timeout = location, max(0, int(retries)), float(timeout)
        config = Config(connect_timeout=timeout, read_timeout=timeout, retries={"total_max_attempts": 1},
                        signature_version="s3v4")
        try:
            self.client = boto3.session.Session().client("s3", config=config)
        except BotoCoreError as err:  # e.g. AWS_PROFILE naming a profile no config or credentials file has
            raise DataError(f"{location}: {err}") from None
        except ValueError:  # botocore's "Invalid endpoint: X" (no scheme or host)
            raise DataError(_bad_endpoint(location, "no http:// or https:// and host")) from None
        self.endpoint = self.client.meta.endpoint_url
        _check_endpoint(location, self.endpoint)

    def _where(self, relative: str) -> str:
        return f"{self.endpoint}: {self.location.url(relative)}"

    def call(self, relative: str, what: str, action: Callable[[], T], notify: bool = False) -> T:
        """action() with retries of transient failures; DataError naming endpoint and object otherwise.
        notify: each retry is a line on stderr (shard reads during training; start-up fails in one line)."""
        from botocore.exceptions import (BotoCoreError, ClientError, ConnectionError as BotoConnectionError,
                                         HTTPClientError, IncompleteReadError, NoCredentialsError,
                                         ReadTimeoutError, ResponseStreamingError)

        attempt = 0
        while True:
            try:
                return action()
            except ClientError as err:
                code = str(err.response.get("Error", {}).get("Code", ""))
                status = int(err.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
                if code in ("NoSuchKey", "404", "NotFound") and status == 404 or code == "NoSuchKey":
                    raise MissingObject(f"{self._where(relative)}: no such object ({what})") from None
                if code == "NoSuchBucket":
                    raise DataError(f"{self._where(relative)}: no bucket {self.location.bucket!r} ({what})") from None
                if code in _AUTH_CODES or status == 403:
                    raise DataError(f"{self._where(relative)}: access refused ({code or status}: wrong or missing "
                                    f"credentials, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_PROFILE) "
                                    f"({what})") from None
                if not (status >= 500 or code in _RETRY_CODES):
                    raise DataError(f"{self._where(relative)}: {code or status} ({what})") from None
                reason = f"{code or status} answer"
            except NoCredentialsError:
                raise DataError(f"{self._where(relative)}: no credentials (set AWS_ACCESS_KEY_ID and "
                                f"AWS_SECRET_ACCESS_KEY, or AWS_PROFILE) ({what})") from None
            except (BotoConnectionError, HTTPClientError, ReadTimeoutError, ResponseStreamingError, IncompleteReadError,
                    ConnectionError, TimeoutError) as err:
                reason = type(err).__name__
            except BotoCoreError as err:
                raise DataError(f"{self._where(relative)}: {type(err).__name__} ({what})") from None
            if attempt >= self.retries:
                raise DataError(f"{self._where(relative)}: {what} failed after {attempt + 1} attempts, the last "
                                f"with {reason} (retries {self.retries}, timeout {self.timeout:g} s: "
                                f"--remote-retries / --remote-timeout, or data.remote_retries / remote_timeout of a run "
                                f"config): is the endpoint reachable?") from None
            delay = min(BACKOFF_MAX_S, BACKOFF_S * 2 ** attempt)
            if notify:
                print(f"remote: {self._where(relative)}: {what}: {reason}, retry {attempt + 1}/{self.retries} in "
                      f"{delay:g} s", file=sys.stderr, flush=True)
            time.sleep(delay)
            attempt += 1

    def head(self, relative: str) -> dict | None:
        """The object's size and metadata, or None when there is none."""
        try:
            answer = self.call(relative, "HEAD", lambda: self.client.head_object(
                Bucket=self.location.bucket, Key=self.location.key(relative)))
        except MissingObject:
            return None
        return {"size": answer["ContentLength"], "sha256": answer.get("Metadata", {}).get("sha256"),
                "etag": answer.get("ETag")}

    def check_bucket(self) -> None:
        """DataError naming endpoint and bucket unless the bucket answers."""
        try:
            self.call("", "HEAD bucket", lambda: self.client.head_bucket(Bucket=self.location.bucket))
        except MissingObject:
            raise DataError(f"{self.endpoint}: {self.location}: no bucket {self.location.bucket!r}") from None

    def list(self, relative_dir: str) -> list[tuple[str, int, str]]:
        """(path relative to the location, size, ETag) of every object under relative_dir/."""
        prefix = self.location.key(relative_dir.rstrip("/") + "/")
        found, token = [], None
        while True:
            kwargs = {"Bucket": self.location.bucket, "Prefix": prefix, **({"ContinuationToken": token} if token else {})}
            page = self.call(relative_dir, "LIST", lambda: self.client.list_objects_v2(**kwargs))  # noqa: B023
            skip = len(self.location.prefix) + 1 if self.location.prefix else 0
            found += [(item["Key"][skip:], item["Size"], item.get("ETag", "")) for item in page.get("Contents", [])]
            if not page.get("IsTruncated"):
                return found
            token = page["NextContinuationToken"]

    def read_bytes(self, relative: str, what: str) -> bytes:
        def get() -> bytes:
            return self.client.get_object(Bucket=self.location.bucket, Key=self.location.key(relative))["Body"].read()

        return self.call(relative, what, get)

    def download(self, relative: str, handle: BinaryIO, what: str, size: int, notify: bool = False) -> str:
        """The object's bytes into `handle` (from its start; a retry starts over); returns their sha256.
        An object longer than `size` (the manifest's) is refused before it outgrows the room made for it."""
        def get() -> str:
            handle.seek(0)  # over what a failed try wrote; the file keeps its reserved size (cache.py)
            digest, written = hashlib.sha256(), 0
            body = self.client.get_object(Bucket=self.location.bucket, Key=self.location.key(relative))["Body"]
            for block in body.iter_chunks(CHUNK):
                written += len(block)
                if written > size:
                    body.close()
                    raise DataError(f"{self._where(relative)}: larger than the manifest's {size} bytes (a replaced "
                                    f"object, or a manifest of other data)")
                digest.update(block)
                handle.write(block)
            handle.truncate(written)
            handle.flush()
            return digest.hexdigest()

        return self.call(relative, what, get, notify)

    def delete(self, relative: str) -> None:
        self.call(relative, "DELETE", lambda: self.client.delete_object(
            Bucket=self.location.bucket, Key=self.location.key(relative)))

    def put_bytes(self, relative: str, data: bytes) -> None:
        """A small object from memory (a run's data lease: launcher/run_dir/data_lease.py)."""
        self.call(relative, "PUT", lambda: self.client.put_object(
            Bucket=self.location.bucket, Key=self.location.key(relative), Body=data))

    def upload_file(self, path: Path, relative: str, sha256: str, transfer_config) -> None:
        """A file to the object (multipart above the transfer config's threshold), its sha256 as metadata."""
        self.call(relative, "upload", lambda: self.client.upload_file(
            str(path), self.location.bucket, self.location.key(relative),
            ExtraArgs={"Metadata": {"sha256": sha256}}, Config=transfer_config))

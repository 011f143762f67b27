"""Finding input files, validating them line by line, and streaming their documents.

Documents are read through `datasets` in streaming mode (text/json/parquet builders, .gz handled by
`datasets`), which keeps memory flat. `datasets` reports bad rows without a line number, so each file
is first checked by `check_file` (one pass of plain line reads): a bad line raises DataError naming
file and line, or in lenient mode is recorded; the documents are then read from a cleaned copy
without those lines. An empty file, a missing file and a glob matching nothing are errors too.
"""
from __future__ import annotations

import contextlib
import glob
import gzip
import json
import os
import re
import shutil
import struct
import sys
import tempfile
import unicodedata
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from data_pipeline.config import CleaningConfig, InputConfig
from data_pipeline.errors import DataError

_EXTENSIONS = {".txt": "txt", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # keeps \t and \n


def resolve_inputs(specs: list[str]) -> list[Path]:
    """Files named by `specs` (files, directories searched recursively, globs), in a stable order."""
    files: list[Path] = []
    for spec in specs:
        path = Path(spec)
        if glob.has_magic(spec) and not path.exists():  # an existing file named "star[1].txt" is that file
            matched = sorted(Path(p) for p in glob.glob(spec, recursive=True) if Path(p).is_file())
            if not matched:
                raise DataError(f"{spec}: glob matched no files")
            files.extend(matched)
        elif path.is_dir():
            # Hidden files (stamps, editor backups) are not corpus files, nor prepared data kept below the
            # corpus (its manifest.json and samples are our output, not the user's text).
            prepared = [d.parent for d in path.rglob("manifest.json") if d.parent != path]
            matched = sorted(p for p in path.rglob("*") if p.is_file() and _known_format(p)
                             and not any(part.startswith(".") for part in p.relative_to(path).parts)
                             and not any(p.is_relative_to(d) for d in prepared))
            if not matched:
                raise DataError(f"{spec}: directory holds no .txt/.jsonl/.json/.parquet files")
            files.extend(matched)
        elif path.is_file():
            files.append(path)
        elif path.exists():
            raise DataError(f"{spec}: not a regular file (a FIFO, socket or device); give a file or a directory of "
                            f"files (they are read more than once)")
        else:
            raise DataError(f"{spec}: no such file or directory")
    seen: set[Path] = set()
    return [p for p in files if not (p.resolve() in seen or seen.add(p.resolve()))]


def _known_format(path: Path) -> str | None:
    suffixes = path.suffixes[-2:] if path.suffix == ".gz" else path.suffixes[-1:]
    return _EXTENSIONS.get(suffixes[0]) if suffixes else None


def file_format(path: Path, forced: str) -> str:
    if forced != "auto":
        return forced
    fmt = _known_format(path)
    if fmt is None:
        raise DataError(f"{path}: unknown file type {''.join(path.suffixes[-2:]) or '(no extension)'}: text is read "
                        f"from .txt, .jsonl, .json or .parquet files (optionally .gz); rename it, or give `data "
                        f"prepare` its format with --format txt|jsonl|parquet")
    return fmt


def estimated_text_bytes(path: Path) -> int:
    """Uncompressed size (a gzip file records it modulo 4 GiB in its last 4 bytes)."""
    size = path.stat().st_size
    if path.suffix == ".gz" and size >= 4:
        with open(path, "rb") as f:
            f.seek(-4, os.SEEK_END)
            # A damaged trailer can claim any size: no real gzip inflates past ~1032x (deflate's limit).
            return max(size, min(struct.unpack("<I", f.read(4))[0], 1032 * size))
    return size


def _gzip_reason(path: Path, err: Exception) -> str:
    return f"corrupt gzip: {err}" if path.suffix == ".gz" else str(err)


@dataclass
class FileCheck:
    """What `check_file` found in one input file."""

    bad_lines: dict[int, str] = field(default_factory=dict)
    """1-based line number -> reason, for lines skipped in lenient mode."""
    empty: bool = False
    """The file holds no document text at all."""


def _open_lines(path: Path):
    opener = gzip.open if path.suffix == ".gz" else open
    return opener(path, "rb")


def check_file(path: Path, fmt: str, cfg: InputConfig) -> FileCheck:
    """Validate a file before reading it; strict mode raises DataError('file:line: reason')."""
    found = FileCheck()

    def bad(line_no: int | None, reason: str) -> None:
        where = f"{path}:{line_no}" if line_no is not None else str(path)
        if not cfg.lenient:
            raise DataError(f"{where}: {reason}")
        if line_no is None:
            found.empty = True
        else:
            found.bad_lines[line_no] = reason

    if fmt == "parquet":
        _check_parquet(path, cfg, bad)
        return found
    any_text = False
    try:
        with _open_lines(path) as f:
            for line_no, raw in enumerate(f, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    bad(line_no, f"invalid UTF-8 (at byte {err.start} of the line)")
                    continue
                if not line.strip():
                    continue
                if fmt == "jsonl":
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as err:
                        bad(line_no, f"malformed JSON ({err.msg}, column {err.colno}; "
                                     "expected one JSON object per line)")
                        continue
                    if not isinstance(record, dict) or cfg.text_field not in record:
                        bad(line_no, f"missing text field {cfg.text_field!r}")
                        continue
                    value = record[cfg.text_field]
                    if not isinstance(value, str):
                        bad(line_no, f"text field {cfg.text_field!r} is {type(value).__name__}, not a string")
                        continue
                    any_text = any_text or bool(value.strip())
                else:
                    any_text = True
    except (OSError, EOFError, zlib.error) as err:  # truncated or corrupt .gz
        raise DataError(f"{path}: cannot be read ({_gzip_reason(path, err)})") from None
    if not any_text:
        bad(None, "empty file (no document text)")
    return found


def _check_parquet(path: Path, cfg: InputConfig, bad) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path)
    except Exception as err:  # pyarrow raises several types for a corrupt file
        raise DataError(f"{path}: not a readable parquet file ({err})") from err
    if cfg.text_field not in meta.schema_arrow.names:
        raise DataError(f"{path}: missing text field {cfg.text_field!r} (columns: {meta.schema_arrow.names})")
    field_type = meta.schema_arrow.field(cfg.text_field).type
    if not (pa.types.is_string(field_type) or pa.types.is_large_string(field_type)):
        raise DataError(f"{path}: text field {cfg.text_field!r} has type {field_type}, not string")
    if meta.metadata.num_rows == 0:
        bad(None, "empty file (no rows)")


def iter_raw_documents(path: Path, fmt: str, cfg: InputConfig, check: FileCheck) -> Iterator[str]:
    """Stream the documents of one checked file through `datasets` (streaming, so memory stays flat)."""
    if check.empty:
        return
    source = path
    cleaned = None
    if check.bad_lines:  # lenient mode: read a copy without the bad lines
        cleaned = _write_cleaned_copy(path, check.bad_lines)
        source = cleaned
    # `datasets` takes data_files as glob patterns: a literal "star[1].txt" is read through a plain name.
    plain = _plain_name(source) if glob.has_magic(str(source)) else None
    try:
        yield from _stream_with_datasets(plain or source, fmt, cfg)
    finally:
        if cleaned is not None:
            cleaned.unlink(missing_ok=True)
        if plain is not None:
            shutil.rmtree(plain.parent, ignore_errors=True)


def _plain_name(path: Path) -> Path:
    """A symlink to `path` under a name without glob characters (in a private temporary directory)."""
    suffix = "".join(path.suffixes[-2:] if path.suffix == ".gz" else path.suffixes[-1:])
    link = Path(tempfile.mkdtemp(prefix="roformer-input-")) / f"input{re.sub(r'[][*?]', '', suffix)}"
    link.symlink_to(path.resolve())
    return link


def _stream_with_datasets(path: Path, fmt: str, cfg: InputConfig) -> Iterator[str]:
    # Local files only: `datasets` reads this when it is first imported, so it is set here (never at
    # import of this module) unless the caller chose otherwise.
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    builder, options, column = (("text", {"sample_by": "paragraph" if cfg.txt_mode == "paragraph" else "line"}, "text")
                                if fmt == "txt" else ("json" if fmt == "jsonl" else "parquet", {}, cfg.text_field))
    with _torch_unseen_by(datasets):
        ds = datasets.load_dataset(builder, data_files=[str(path)], split="train", streaming=True, **options)
    for batch in ds.iter(batch_size=1024):
        for text in batch[column]:
            if text is not None:
                yield text


@contextlib.contextmanager
def _torch_unseen_by(datasets):
    """A streaming dataset built as if torch were not installed, unless this process already imported it: `datasets`
    imports all of torch to make its epoch counter a shared tensor for DataLoader workers (2+ CPU-s of every
    `roformer data prepare`, which reads documents as plain Python strings and never uses torch)."""
    config = datasets.config
    before = config.TORCH_AVAILABLE
    if "torch" not in sys.modules:
        config.TORCH_AVAILABLE = False
    try:
        yield
    finally:
        config.TORCH_AVAILABLE = before


def _write_cleaned_copy(path: Path, bad_lines: dict[int, str]) -> Path:
    suffix = "".join(path.suffixes[-2:] if path.suffix == ".gz" else path.suffixes[-1:])
    suffix = suffix.removesuffix(".gz")
    fd, name = tempfile.mkstemp(prefix="roformer-clean-", suffix=suffix)
    with os.fdopen(fd, "wb") as out, _open_lines(path) as f:
        for line_no, raw in enumerate(f, start=1):
            if line_no not in bad_lines:
                out.write(raw)
    return Path(name)


def clean_text(text: str, cfg: CleaningConfig) -> str:
    """Normalize one document; an empty result means the document is dropped."""
    if cfg.nfkc:
        text = unicodedata.normalize("NFKC", text)
    if cfg.strip_control:
        text = _CONTROL.sub("", text)
    return text.strip()

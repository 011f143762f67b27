"""Where a command may write: the one check of every command's output paths (docs/bad_inputs.md).

    check_paths(inputs={"--train": t, "--dev": d}, outputs={"--out": o, "--predictions": p})
    check_replaceable("--out", out, DATA)      # a directory the command replaces: its own kind or empty

Refused, in one line naming both flags, before anything is read or written: an output equal to, inside
or containing an input or another output of the same command (the input would be overwritten, the
second output would replace the first, or a later read would take the output for input); a URL
(`s3://`, `hdfs://`, `http://` ...) where a local path is meant (it would become a local `./s3:/...`);
(prepared data may be s3://: data.data_dir, `data prepare --out`, `data upload`); an output file that is a directory, an output directory that is a file; a non-empty directory the command
would replace that is not of its own kind (prepared data, an export, a run directory).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from launcher.errors import UserError

# "s3://b/d" reaches us as Path("s3:/b/d") from argparse's type=Path; a one-letter scheme is a drive letter.
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/")


@dataclass(frozen=True)
class Kind:
    """A kind of directory a command replaces, known by its marker files."""

    name: str
    markers: tuple[str, ...]
    made_by: str


DATA = Kind("prepared data", ("manifest.json",), "roformer data prepare")
EXPORT = Kind("export", ("export_info.json",), "roformer export")
# Files only a run writes (a user's folder may well hold a config.yaml or a metrics.jsonl of its own).
RUN = Kind("run directory", ("stages.json", "ds_config.resolved.json", "config_versions.json", "restarts.json",
                             "init_from.json", "branch_from.json", "checkpoints", "universal", "heartbeats",
                             ".deepspeed_env", "logs/launcher.log"), "roformer pretrain")
KINDS = (DATA, EXPORT, RUN)

EXPORT_ENTRIES = frozenset({
    "config.json", "model.safetensors", "pytorch_model.bin", "README.md", "export_info.json",
    "tokenizer", "spm.model", "spm.vocab", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "vocab.txt", "sentencepiece.bpe.model", "modules.json", "sentence_bert_config.json",
    "config_sentence_transformers.json", "1_Pooling", "2_Normalize", "model.safetensors.index.json",
    "added_tokens.json"})
"""What `roformer export` writes (and wrote in earlier releases): anything else in an export directory
is the user's, and replacing the directory would delete it."""


def refuse_url(flag: str, value) -> None:
    """A URL where a local path is meant would silently become a local `./s3:/...` path. Object storage is
    read and written only as prepared data (data.data_dir, `data prepare --out`, `data upload`), which do
    not call this."""
    if value is not None and _URL.match(str(value)):
        scheme, rest = str(value).split(":/", 1)
        raise UserError(f"{flag} {scheme}://{rest.lstrip('/')}: a {scheme}:// URL, but a local path is expected "
                        f"(only prepared data may live in object storage, as s3://BUCKET/PREFIX: data.data_dir, "
                        f"`data prepare --out`, `data upload`; give a local or mounted path here)")


def _flat(paths: dict) -> list[tuple[str, Path]]:
    flat = []
    for flag, value in paths.items():
        values = value if isinstance(value, (list, tuple)) else [value]
        for each in values:
            if each is None or each == "":
                continue
            refuse_url(flag, each)
            flat.append((flag, Path(each)))
    return flat


def _relation(a: Path, b: Path) -> str | None:
    """How path a stands to path b: 'is', 'is inside', 'contains', or None."""
    ra, rb = a.expanduser().resolve(), b.expanduser().resolve()
    if ra == rb:
        return "is"
    if ra.is_relative_to(rb):
        return "is inside"
    if rb.is_relative_to(ra):
        return "contains"
    return None


_NOUNS = {"RUN_DIR": "the run directory", "EXPORT": "the export", "--data": "the prepared data"}


def check_paths(inputs: dict, outputs: dict, may_hold: tuple[str, ...] = ()) -> None:
    """Refuse URLs, and an output that is, is inside or contains an input or another output.
    Values are paths, lists of paths or None (not given). `may_hold`: the flags of inputs that keep
    outputs inside them by design (RUN_DIR/export, RUN_DIR/report.md): only equal or containing is refused."""
    ins, outs = _flat(inputs), _flat(outputs)
    for i, (flag, out) in enumerate(outs):
        for other_flag, other in ins:
            how = _relation(out, other)
            if how == "is inside" and other_flag in may_hold:
                continue
            if how is not None:
                noun = _NOUNS.get(other_flag, "it")
                raise UserError(f"{flag} {out}: {how} the input {other_flag} {other}; writing there would "
                                f"{'replace' if how != 'is inside' else 'mix the output into'} {noun}: choose "
                                f"another {flag}")
        for other_flag, other in outs[i + 1:]:
            how = _relation(out, other)
            if how is not None:
                raise UserError(f"{flag} {out}: {how} {other_flag} {other} of the same command; one output would "
                                f"replace the other: give them different paths")


def check_output_file(flag: str, path: Path | None) -> None:
    """An output file: not a directory, and its parent (if it exists) not a file."""
    if path is None:
        return
    refuse_url(flag, path)
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{flag} {path}: is a directory; give a file name (e.g. {path / 'report.json'})")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UserError(f"{flag} {path}: cannot create it: {parent} is a file, not a directory")
            break


def check_output_dir(flag: str, path: Path | None) -> None:
    """An output directory written into: not a file (nor below one)."""
    if path is None:
        return
    refuse_url(flag, path)
    path = Path(path)
    for each in (path, *path.parents):
        if each.exists():
            if not each.is_dir():
                raise UserError(f"{flag} {path}: exists and is not a directory" if each == path else
                                f"{flag} {path}: cannot create it: {each} is a file, not a directory")
            break


def kind_of(path: Path) -> Kind | None:
    path = Path(path)
    for kind in KINDS:
        if any((path / marker).exists() for marker in kind.markers):
            return kind
    return None


def check_replaceable(flag: str, path: Path | None, kind: Kind) -> None:
    """A directory the command will replace or fill: missing, empty, or of `kind` (never another
    kind, never the user's folder)."""
    if path is None:
        return
    check_output_dir(flag, path)
    path = Path(path)
    if not path.is_dir():
        return
    # A killed prepare's `.partial-PID` is its own leftover, not the user's.
    entries = sorted(p.name for p in path.iterdir() if not (kind is DATA and p.name.startswith(".partial-")))
    if not entries:
        return
    found = kind_of(path)
    if found is kind:
        if kind is EXPORT:
            _check_export_entries(flag, path, entries)
        return
    what = f"is {_a(found.name)} ({found.made_by})" if found else f"holds {_listing(path, entries)}"
    wanted = "a previous export" if kind is EXPORT else _a(kind.name)
    raise UserError(f"{flag} {path}: not empty and not {wanted}; "
                    f"it {what}: choose a new or empty directory")


def _a(name: str) -> str:
    return name if name == "prepared data" else f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _check_export_entries(flag: str, path: Path, entries: list[str]) -> None:
    """Replacing an earlier export deletes all of it: refused while it holds anything else."""
    foreign = [name for name in entries if name not in EXPORT_ENTRIES and not name.startswith(".")
               and not (name.startswith("model-") and name.endswith(".safetensors"))]  # weight shards
    if foreign:
        raise UserError(f"{flag} {path}: the earlier export there also holds {_listing(path, foreign)}, which "
                        f"replacing it would delete: move them out, or export to another directory")


def _listing(path: Path, names: Iterable[str], limit: int = 3) -> str:
    names = list(names)
    shown = [f"{name}/" if (path / name).is_dir() else name for name in names[:limit]]
    return ", ".join(shown) + (f" and {len(names) - limit} more" if len(names) > limit else "")


@contextlib.contextmanager
def writer_lock(flag: str, out: Path, command: str) -> Iterator[None]:
    """One writer per output directory: an flock(2) on `.OUT.lock` beside it, held while the command
    writes, so a second command into the same directory is refused instead of silently replacing the
    first's output. The lock file is removed by its holder; a killed holder's lock dies with it."""
    out = Path(out)
    lock_path = out.parent / f".{out.name}.lock"
    out.parent.mkdir(parents=True, exist_ok=True)
    fd = _locked(flag, out, lock_path, command)
    try:
        yield
    finally:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(lock_path)
            os.close(fd)


def _locked(flag: str, out: Path, lock_path: Path, command: str) -> int | None:
    """The open, flocked lock file (None where it cannot be created: a read-only parent)."""
    while True:
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = os.pread(fd, 64, 0).decode("utf-8", "replace").strip() or "?"
            os.close(fd)
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            raise UserError(f"{flag} {out}: another {command} (pid {holder}) is writing it now; wait for it "
                            f"or choose another {flag}") from None
        try:  # the holder before us may have removed the file between our open and our flock: lock the new one
            same = os.stat(lock_path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            return fd
        os.close(fd)


def check_run_dir_target(flag: str, run_dir) -> None:
    """`pretrain --run-dir`: a local path, missing, empty or a run directory (resumed): never a folder of
    the user's files nor prepared data, which the run's records would be mixed into."""
    refuse_url(flag, run_dir)
    check_replaceable(flag, Path(run_dir), RUN)

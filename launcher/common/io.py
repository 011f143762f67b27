"""Files that are never seen half-written, console lines never glued to another process's and never
fatal when the console went away, file checksums, and config files read as a mapping with one-line
errors (the one copy of each).

A write goes to a hidden temporary file next to the target, is flushed to disk, and is renamed over
the target (os.replace is atomic on POSIX): a reader sees the old file or the new one, never a mix,
and a crash leaves at most a `.NAME.tmp<pid>` file behind. The directory is fsynced after the
rename, so the new file also survives a power loss (fsync helpers: data_pipeline.durable).
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import select
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, TextIO

import yaml

from data_pipeline.durable import fsync_dir, fsync_file, fsync_tree  # noqa: F401  (re-exported)
from launcher.common.errors import UserError


def _atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as handle:  # synced once, by _atomic_write
            handle.write(data)

    _atomic_write(path, write)


def atomic_write_json(path: Path, payload: Any) -> None:
    """Indented JSON with a final newline (every JSON file of a run directory and a report)."""
    atomic_write_text(path, json.dumps(payload, indent=2) + "\n")


def atomic_torch_save(obj: Any, path: Path) -> None:
    import torch

    _atomic_write(path, lambda tmp: torch.save(obj, tmp))


def read_json_object(path: Path) -> dict:
    """A JSON object file's content; {} when it is missing, unreadable or not an object (a record that
    may not be there)."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_line(text: str, stream: TextIO | None = None) -> None:
    """`text` and its newline in ONE write, flushed (default stream: stderr). The ranks of a node share
    one pipe, and under `python -u` print() writes the text and the newline separately: a peer's line
    could land between them, and a process ending between them loses the newline. One write of a line
    (below PIPE_BUF, 4 kB) reaches a pipe whole. Never raises because the console went away
    (write_text)."""
    write_text(text + "\n", sys.stderr if stream is None else stream)


def write_line_kept(text: str) -> None:
    """write_line, and the line appended to the console log too (keep_console's) when the console took it:
    a line said while the job is being stopped can reach a reader that dies with it still in its pipe
    (pdsh killed by DeepSpeed's runner), so the log is where it is sure to be. A console already gone
    put it there itself."""
    if not write_text(text + "\n", sys.stderr) or _console_log is None:
        return
    try:
        _console_log.parent.mkdir(exist_ok=True)
        with open(_console_log, "a", encoding="utf-8") as log:
            log.write(text + "\n")
    except OSError:
        pass


# --- a console that goes away ---------------------------------------------------------------------
# A rank's stdout/stderr is a pipe to DeepSpeed's launcher, pdsh or ssh; killing pdsh or losing the ssh
# session closes it under the running rank (`| head` does the same to a command). Python ignores SIGPIPE,
# so the next write fails with EPIPE: raised in a signal handler's stop message it killed the rank before
# its stop checkpoint, and a failed flush at exit turns any exit code into 120. So a write that finds its
# reader gone points the descriptor at the process's console log (keep_console) or /dev/null with dup2:
# that line and every later one (print(), logging, C code, the interpreter's final flush) then succeed.

GONE_ERRNOS = frozenset({errno.EPIPE, errno.EIO, errno.ECONNRESET})
"""A console write's errno when its reader is gone: a pipe without reader, a hung-up terminal, a closed socket."""
_CONSOLE_FDS = (1, 2)
_console_log: Path | None = None
_console_lock = threading.Lock()
_redirected: set[int] = set()


def keep_console(log: Path | None = None) -> None:
    """This process outlives its console: sys.stdout / sys.stderr (on descriptors 1 and 2) survive their
    reader going away for every writer (print(), a logging handler made after this call), and once it is
    gone what they get is appended to `log` (a rank: RUN_DIR/logs/rank<r>.log; its folder is created
    then, under an existing parent) instead of /dev/null. While the console is there, only the lines of
    write_line_kept go to `log` too. Called again, it only sets `log`. Makes sure SIGPIPE is ignored (as
    Python sets it at start), so a write to a closed pipe fails with EPIPE instead of killing the process."""
    global _console_log
    _console_log = None if log is None else Path(log)
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if not isinstance(stream, _LastingStream) and _descriptor(stream) in _CONSOLE_FDS:
            setattr(sys, name, _LastingStream(stream))
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)


class _LastingStream:
    """sys.stdout / sys.stderr after keep_console: a write or flush that finds the reader gone redirects
    the descriptor (reader_gone) and goes on; everything else is the stream's own."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def __getattr__(self, name: str):
        return getattr(self.stream, name)

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except OSError as err:
            if err.errno not in GONE_ERRNOS or not reader_gone(self.stream):
                raise
        if getattr(self.stream, "write_through", False):  # python -u: nothing of it was kept to flush
            return self.stream.write(text)
        return len(text)  # buffered: reader_gone flushed what the failed write kept

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError as err:
            if err.errno not in GONE_ERRNOS or not reader_gone(self.stream):
                raise


def write_text(text: str, stream: TextIO) -> bool:
    """`text` written and flushed; False when it could not reach the stream's reader. With a descriptor
    the text goes out in one write(2) after the stream's own buffer is flushed, bypassing Python's
    buffer lock (a signal handler's line while the main thread is inside a print() would otherwise raise
    "reentrant call"). Never raises for a console that went away: the descriptor is redirected
    (reader_gone) and the text lands in the console log instead."""
    fd = _descriptor(stream)
    if fd is None:  # no descriptor: a StringIO, pytest's capture
        try:
            stream.write(text)
            stream.flush()
            return True
        except (OSError, ValueError):
            return False
    data = text.encode(getattr(stream, "encoding", None) or "utf-8", "backslashreplace")
    _flush(stream)
    try:
        _write_all(fd, data)
        return True
    except OSError as err:
        if err.errno not in GONE_ERRNOS or not reader_gone(stream):
            return False
    try:
        _write_all(fd, data)  # now to the console log (or /dev/null)
    except OSError:
        pass
    return False


def reader_gone(stream: TextIO) -> bool:
    """The reader of `stream` (stdout or stderr) is gone: point its descriptor, and the other one's when
    its reader is gone too, at the console log (or /dev/null), so later writes and the interpreter's final
    flush succeed; then flush what Python had buffered there. False for any other stream."""
    fd = _descriptor(stream)
    if fd not in _CONSOLE_FDS:
        return False
    with _console_lock:
        gone = [f for f in _CONSOLE_FDS if f == fd and f not in _redirected or _hung_up(f)]
        if gone:
            target = _open_console_log(gone)
            for f in gone:
                os.dup2(target, f)
                _redirected.add(f)
            os.close(target)
    for std in (sys.stdout, sys.stderr):
        std = getattr(std, "stream", std)  # a _LastingStream's own stream: no second redirect from here
        if std is not None and _descriptor(std) in _redirected:
            _flush(std)
    return True


def flush_console() -> None:
    """Flush stdout and stderr (at a process's end); a console that went away is redirected first, so the
    interpreter's own final flush cannot fail and turn the exit code into 120."""
    for stream in (sys.stdout, sys.stderr):
        if stream is None:
            continue
        try:
            stream.flush()
        except OSError as err:
            if err.errno in GONE_ERRNOS:
                reader_gone(stream)
        except (ValueError, RuntimeError, AttributeError):
            pass


def _descriptor(stream) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def _flush(stream) -> None:
    try:
        stream.flush()  # what earlier print()s left in Python's buffer goes first
    except (OSError, ValueError, RuntimeError):  # gone (the write below finds out), closed, reentrant
        pass


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _hung_up(fd: int) -> bool:
    """A pipe whose reader exited (POLLERR), a hung-up terminal or socket (POLLHUP); never a file."""
    poller = select.poll()
    poller.register(fd, 0)  # no events asked: only the error conditions are reported
    try:
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except OSError:
        return False


def _open_console_log(fds: list[int]) -> int:
    """A descriptor on the console log (its first line saying why) or, without one, on /dev/null."""
    log = _console_log
    if log is not None:
        try:
            if not log.parent.is_dir() and log.parent.parent.is_dir():
                log.parent.mkdir(exist_ok=True)
            target = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            names = " and ".join({1: "stdout", 2: "stderr"}[f] for f in fds)
            os.write(target, f"=== {time.strftime('%Y-%m-%d %H:%M:%S %z')}: pid {os.getpid()}: the reader of its "
                             f"{names} went away; its output continues here\n".encode())
            return target
        except OSError:
            pass
    return os.open(os.devnull, os.O_WRONLY)


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's SafeLoader refusing a key given twice in one mapping: PyYAML keeps the last silently, so a
    second `hidden_size:` or a second `model:` block would replace the first without a word."""

    def construct_mapping(self, node, deep=False):
        first_line: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: its keys may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                if key in first_line:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} given twice (first at line {first_line[key]})", key_node.start_mark)
            except TypeError:  # an unhashable key: SafeLoader's own error says so
                break
            first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str):
    """yaml.safe_load, except that a key given twice in one mapping is an error (yaml.YAMLError)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)


def read_config_text(path: str | Path, what: str) -> str:
    """A config file's text (UTF-8); not found, a directory, unreadable or not UTF-8 as one line naming the file."""
    path = Path(path)
    if path.exists() and not path.is_file() and not path.is_dir():  # reading a FIFO would wait for a writer
        raise UserError(f"{path}: not a regular file (a FIFO, socket or device); the {what} is a file")
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: {what} not found") from None
    except IsADirectoryError:
        raise UserError(f"{path}: a directory; the {what} is a file") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: {not_utf8(path)}; a {what} is a UTF-8 text file") from None
    except OSError as err:
        raise UserError(f"{path}: cannot read the {what}: {err.strerror}") from None


def not_utf8(path: Path) -> str | None:
    """Where `path` stops being UTF-8 ('line N: not UTF-8 text (byte 0xXX)'), None when it is UTF-8 throughout.
    Read line by line: a large file is not held in memory."""
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as err:
                return f"line {number}: not UTF-8 text (byte 0x{line[err.start]:02x})"
    return None


def _yaml_error_line(path: Path, err: yaml.YAMLError, text: str = "") -> str:
    """PyYAML's error as one line naming the file and line: its problem, without the quoted source excerpt.
    `text`: the YAML read, for the line of a character its reader refuses (a control character)."""
    mark = getattr(err, "problem_mark", None)
    if mark is not None:
        where = f"line {mark.line + 1}: "
    elif isinstance(err, yaml.reader.ReaderError):
        where = f"line {text.count(chr(10), 0, err.position) + 1}: "
    else:
        where = ""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    return f"{path}: {where}not valid YAML: {problem}"


def read_mapping(path: str | Path, what: str) -> dict:
    """The mapping a config file stores (run config, schedule, DeepSpeed JSON): JSON for *.json, else YAML;
    every error one line naming the file (and the line); `what` names the file's kind. A key given twice
    is refused (YAML) rather than the last one silently winning."""
    path = Path(path)
    text = read_config_text(path, what)
    try:
        raw = json.loads(text, object_pairs_hook=_unique_json_keys) if path.suffix == ".json" else load_yaml(text)
    except json.JSONDecodeError as err:
        raise UserError(f"{path}: line {err.lineno}: not valid JSON: {err.msg}") from None
    except _DuplicateJsonKey as err:
        raise UserError(f"{path}: not valid JSON: key {err.args[0]!r} given twice") from None
    except yaml.YAMLError as err:
        raise UserError(_yaml_error_line(path, err, text)) from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: a {what} must be a mapping, got {type(raw).__name__}")
    return raw


class _DuplicateJsonKey(ValueError):
    """A JSON object naming a key twice (json keeps the last silently); args[0] is the key."""


def _unique_json_keys(pairs: list[tuple[str, Any]]) -> dict:
    result: dict = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateJsonKey(key)
        result[key] = value
    return result

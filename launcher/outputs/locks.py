"""One writer per output (issue 49): an flock(2) on `.OUT.lock` beside the resolved output path, held while a
command writes it (launcher/outputs/output_paths.py re-exports these)."""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path
from typing import Iterator

from launcher.common.errors import UserError


def _read_small(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(64).decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _lock_held(lock_path: Path) -> bool:
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


@contextlib.contextmanager
def writer_lock(flag: str, out: Path, command: str) -> Iterator[None]:
    """One writer per output (the resolved path): an flock(2) on `.OUT.lock` beside it, held while the
    command writes, so a second command into the same place is refused instead of silently replacing the
    first's output. The lock file is removed by its holder; a killed holder's lock dies with it, and its
    file is removed by the next holder."""
    out = Path(out).expanduser().resolve()
    lock_path = out.parent / f".{out.name}.lock"
    created = [each for each in (out.parent, *out.parent.parents) if not each.exists()]
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = _locked(flag, out, lock_path, command)
        try:
            yield
        finally:
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.unlink(lock_path)
                os.close(fd)
    finally:  # a command refused or failed creates nothing: the folders made for the lock go (when empty)
        for each in created:
            try:
                each.rmdir()
            except OSError:
                break


@contextlib.contextmanager
def writer_locks(outputs: dict, command: str) -> Iterator[None]:
    """writer_lock of every output given (flag -> path, None: not given), held together for the block."""
    with contextlib.ExitStack() as stack:
        for flag, path in outputs.items():
            if path is not None:
                stack.enter_context(writer_lock(flag, path, command))
        yield


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
            holder = _read_small(lock_path) or "?"
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
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, str(os.getpid()).encode(), 0)
            except OSError:  # a full disk: no lock file of ours is left behind
                os.unlink(lock_path)
                os.close(fd)
                raise
            return fd
        os.close(fd)

"""Rendezvous ports on this machine: the one place that tries a port and claims one.

A port found free (bind, release) can be taken by anyone before the rank binds it; two of our own
processes asking at once (two local `roformer pretrain` without --master_port, two test lanes) would
get the same one. A claim closes that window among our processes: each port is guarded by a lock
file under PORT_LOCK_DIR, flock'ed by the claimant until it exits, so no other claimant takes it
while its job may still be binding it. Processes outside this program are covered only by the bind
try (nothing can reserve a port for a process that binds it later)."""
from __future__ import annotations

import errno
import fcntl
import os
import socket
import tempfile
from collections.abc import Iterable
from pathlib import Path

from launcher.common.errors import UserError

# Shared by every user and worktree of the machine (ports are too): sticky and world-writable like /tmp.
PORT_LOCK_DIR = Path(tempfile.gettempdir()) / "roformer-ports"
# `roformer pretrain` on one machine without --master_port: DeepSpeed's 29500 when free, else the next
# free unclaimed one within this span (below the kernel's ephemeral range, 32768 up on Linux).
AUTO_PORT_SPAN = 1000

_held: dict[int, int] = {}  # port -> fd of its lock, kept open (the claim) until this process exits


def port_in_use(port: int, host: str = "") -> bool:
    """Whether binding `port` on this machine fails with EADDRINUSE (a finished job's TIME_WAIT does not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            return err.errno == errno.EADDRINUSE
    return False


def check_port_free(port: int, host: str = "") -> None:
    """The rendezvous port of a job on this machine, tried before any rank starts: taken, every rank
    would fail with the process group's EADDRINUSE traceback, which does not name the flag."""
    if port_in_use(port, host):
        raise UserError(f"--master_port {port}: port {port} is in use on this machine (another job's "
                        f"rendezvous?); pass another --master_port")


def claim_port(candidates: Iterable[int]) -> int:
    """The first of `candidates` that no other process of ours has claimed and that is free now;
    claimed by this process until it exits (never handed out twice by it either)."""
    tried = []
    for port in candidates:
        if port in _held:
            continue
        tried.append(port)
        fd = _lock_port(port)
        if fd is None:
            continue
        if port_in_use(port):
            os.close(fd)
            continue
        _held[port] = fd
        return port
    span = f"{tried[0]}-{tried[-1]}" if tried else "none left"
    raise UserError(f"no free rendezvous port on this machine (tried {span}); pass --master_port")


def _lock_port(port: int) -> int | None:
    """A held flock on PORT_LOCK_DIR/<port>, or None when another process holds it (or another user's
    lock file cannot be opened: that port is left to them)."""
    if not PORT_LOCK_DIR.is_dir():
        try:
            PORT_LOCK_DIR.mkdir()
            os.chmod(PORT_LOCK_DIR, 0o1777)  # other users' claims go in here too
        except FileExistsError:
            pass  # made by another claimant just now
        except OSError as err:
            raise UserError(f"cannot claim a rendezvous port in {PORT_LOCK_DIR} ({err.strerror}); "
                            "pass --master_port") from None
        if not PORT_LOCK_DIR.is_dir():
            raise UserError(f"cannot claim a rendezvous port: {PORT_LOCK_DIR} is not a directory; pass --master_port")
    path = PORT_LOCK_DIR / str(port)
    try:  # read-only suffices for flock; O_CREAT only when missing (a sticky /tmp refuses it on others' files)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except PermissionError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def claim_default_port(first: int) -> int:
    """A single-machine job's port when none was given: `first` if free, else the next free one."""
    return claim_port(range(first, first + AUTO_PORT_SPAN))

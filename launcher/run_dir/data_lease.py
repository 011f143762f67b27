"""A run's lease on the prepared data it reads, so that data in use is not replaced under it (issue 63).

    with leased_data(cfg.data, run_dir, rank):       # the rank entry, for the rank's life (rank 0 writes it)
    refuse_leased(location, "--out", note=print)     # `data prepare --out`, `data upload`: before writing

A lease is one small JSON object in the data location, DATA/.leases/<lock id>.json (local) or
s3://BUCKET/PREFIX/.leases/<lock id>.json, naming the run directory and the id of the run lock its job holds
(launcher/run_dir/lock.py). It is live while that run's lock file holds the same id and `stale_reason` finds
its holder running: the lock stays the one liveness judgement. Where the checking host cannot read the run
directory (a run on another host with its data in object storage), the lease's own `refreshed_at`, rewritten
every REFRESH_SECONDS by rank 0, stands in: older than STALE_SECONDS is stale. A stale lease is removed by the
next writer or run with one line ("took over"). Dotted names: neither `data upload` nor the readers of a data
directory (manifest, shards, tokenizer/) ever see it, and `data prepare --overwrite` replaces only its
tokenizer/ and splits.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from data_pipeline.remote.client import MissingObject, RemoteStore
from data_pipeline.remote.url import is_remote, parse_location
from launcher.common.errors import UserError
from launcher.common.io import atomic_write_json, write_line
from launcher.run_dir.lock import REFRESH_SECONDS, STALE_SECONDS, read_holder, stale_reason

LEASES_DIR = ".leases"


class DataInUse(UserError):
    """A live run's lease holds the data location; the message names the run directory."""


@dataclass
class DataLease:
    """The content of one lease."""

    run_dir: str
    """Absolute path of the run directory whose job reads the data."""
    lock_id: str
    """The id of that job's run lock (LockHolder.lock_id): the lease is live while the lock holds this id."""
    host: str
    """socket.gethostname() of rank 0, which wrote it."""
    pid: int
    """Rank 0's process id (for the reader: liveness is the lock's)."""
    started_at: float
    refreshed_at: float
    """time.time() of the latest refresh: the liveness where the run directory cannot be read."""


def lease_stale_reason(lease: DataLease, now: float | None = None) -> str | None:
    """Why `lease`'s job is gone (the lease may be taken over), or None while it may still be reading."""
    now = time.time() if now is None else now
    run_dir, here = Path(lease.run_dir), lease.host == socket.gethostname()
    holder = read_holder(run_dir) if run_dir.is_dir() else None
    if holder is not None:
        if holder.lock_id != lease.lock_id:
            return f"{run_dir} is locked by another job now ({holder.describe(now)})"
        return stale_reason(holder, now=now)
    if here:  # this host sees the run directory: no lock file means the job ended
        return f"its job ended (no run lock in {run_dir})" if run_dir.is_dir() else f"{run_dir} is gone"
    # Another host's run directory, unreadable from here (or holding no lock): the lease's own age decides.
    age = now - lease.refreshed_at
    return f"not refreshed for {age:.0f} s (bound {STALE_SECONDS:g} s)" if age > STALE_SECONDS else None


class _Place:
    """The leases of one data location, local directory or s3:// prefix: list, read, write, delete."""

    def __init__(self, location, retries: int = 5, timeout: float = 30.0):
        self.remote = is_remote(location)
        self.shown = str(location)
        if self.remote:
            self.store = RemoteStore(parse_location(location, "data location"), retries, timeout)
        else:
            self.root = Path(location) / LEASES_DIR

    def where(self, name: str) -> str:
        return f"{self.shown.rstrip('/')}/{LEASES_DIR}/{name}"

    def leases(self) -> list[tuple[str, DataLease | None]]:
        """(file name, lease) of every lease there; None for one that is not a lease record."""
        if self.remote:
            names = [rel.rsplit("/", 1)[-1] for rel, _, _ in self.store.list(LEASES_DIR)]
        else:
            names = sorted(p.name for p in self.root.glob("*.json")) if self.root.is_dir() else []
        found = []
        for name in names:
            try:
                raw = (self.store.read_bytes(f"{LEASES_DIR}/{name}", "read a data lease") if self.remote
                       else (self.root / name).read_bytes())
            except (FileNotFoundError, MissingObject):
                continue  # released meanwhile
            try:
                found.append((name, DataLease(**json.loads(raw))))
            except (ValueError, TypeError):  # not JSON, not UTF-8, other fields
                found.append((name, None))
        return found

    def write(self, lease: DataLease) -> None:
        name = f"{lease.lock_id}.json"
        if self.remote:
            self.store.put_bytes(f"{LEASES_DIR}/{name}", json.dumps(dataclasses.asdict(lease)).encode())
        else:
            self.root.mkdir(exist_ok=True)
            atomic_write_json(self.root / name, dataclasses.asdict(lease))

    def delete(self, name: str) -> None:
        if self.remote:
            self.store.delete(f"{LEASES_DIR}/{name}")
        else:
            (self.root / name).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                self.root.rmdir()  # the last one: the data directory as prepare left it


def live_leases(location, flag: str, note: Callable[[str], None] = write_line, retries: int = 5,
                timeout: float = 30.0, skip_lock_id: str | None = None) -> list[tuple[str, DataLease]]:
    """(where, lease) of every live lease on `location` (a prepared data directory or s3:// prefix) but the one of
    `skip_lock_id`; each stale one is removed ("taken over") with one line to `note`."""
    if not is_remote(location) and not (Path(location) / LEASES_DIR).is_dir():
        return []
    place, live = _Place(location, retries, timeout), []
    for name, lease in place.leases():
        if lease is not None and lease.lock_id == skip_lock_id:
            continue
        reason = "not a lease record" if lease is None else lease_stale_reason(lease)
        if reason is None:
            live.append((place.where(name), lease))
            continue
        place.delete(name)
        owner = f"the run {lease.run_dir}" if lease is not None else "an unreadable lease"
        note(f"{flag} {location}: took over the data lease of {owner} ({place.where(name)}): {reason}")
    return live


def refuse_leased(location, flag: str, note: Callable[[str], None] = write_line, retries: int = 5,
                  timeout: float = 30.0) -> None:
    """DataInUse naming the run directory when a live run's lease holds `location`, which the command is about to
    replace or write (`data prepare --out`, `data upload`); stale leases are taken over (`live_leases`)."""
    for where, lease in live_leases(location, flag, note, retries, timeout)[:1]:
        raise DataInUse(f"{flag} {location}: in use by the run {lease.run_dir} (its job on {lease.host} reads it; "
                        f"lease {where}, refreshed {max(0.0, time.time() - lease.refreshed_at):.0f} s ago): wait "
                        f"for that run to end or stop it, or write to another location")


@contextlib.contextmanager
def leased_data(data, run_dir: Path, rank: int, refresh_every: float = REFRESH_SECONDS) -> Iterator[None]:
    """Rank 0: the run's lease on `data.data_dir` (a launcher.config.sections.DataSection) for the rank's life,
    refreshed every `refresh_every` s, released when rank 0 ends (a killed one's is judged stale by its lock);
    other runs' stale leases there are taken over (live ones stay: runs may share data). Released even between
    the starts of `--max-restarts`: a lease left for the launcher would outlive every finished job in the user's
    data, as a stale file each later command has to take over. Data the rank cannot write to (a read-only
    dataset) is read without a lease, with one line. Other ranks: nothing."""
    holder = read_holder(run_dir) if rank == 0 else None
    if holder is None:  # rank > 0, or no lock (cannot happen under held_run_dir): nothing to name the job by
        yield
        return
    options = data.remote_options() if data.is_remote else None
    retries, timeout = (options.retries, options.timeout) if options else (5, 30.0)
    note = lambda text: write_line(f"pretrain (rank 0): note: {text}")  # noqa: E731
    now = time.time()
    lease = DataLease(str(Path(run_dir).resolve()), holder.lock_id, socket.gethostname(), os.getpid(), now, now)
    try:
        live_leases(data.data_dir, "data.data_dir", note, retries, timeout, skip_lock_id=holder.lock_id)
        place = _Place(data.data_dir, retries, timeout)
        place.write(lease)
    except (OSError, UserError, ValueError) as err:  # DataError is a ValueError
        note(f"data.data_dir {data.data_dir}: no data lease written ({getattr(err, 'strerror', None) or err}): "
             f"`data prepare --overwrite` / `data upload` there cannot see that this run reads it")
        yield
        return
    stop = threading.Event()

    def refresh() -> None:
        while not stop.wait(refresh_every):
            with contextlib.suppress(OSError, UserError, ValueError):  # a hiccup: the next refresh tries again
                place.write(dataclasses.replace(lease, refreshed_at=time.time()))

    thread = threading.Thread(target=refresh, name="data-lease", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
        with contextlib.suppress(OSError, UserError, ValueError):
            place.delete(f"{lease.lock_id}.json")

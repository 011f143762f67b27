"""One job per run directory: the lock file RUN_DIR/heartbeats/run.lock, its one writer and one reader.

    with acquire(run_dir) as lock:   # UserError naming the holder when another live job has it

`roformer pretrain` holds it for the whole job and hands its id to the ranks (LOCK_ID_ENV); in a job
started without it (plain mpirun / srun) rank 0 takes it. The file (a LockHolder) is created by link(2),
which fails when the name exists (on NFS too), and a stale holder is taken over under an flock(2) on
`.run.lock.guard`, so two newcomers cannot both win. It lives in heartbeats/, the one place every launch
rewrites (docs/unattended.md).

The lock belongs to the job, not to the process that took it (issue 63): every rank records itself beside it
(heartbeats/job.rank<r>.json, a JobMember with the lock's id, refreshed like the lock), and a holder is stale
only when its own process and every recorded rank of its job are gone (a dead pid on this host; no refresh for
`stale_after` seconds elsewhere). A launcher killed while its ranks train on keeps the directory theirs until
they end (they stop on their own: launcher/launch/rank_process.py watches the launcher).
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import secrets
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from launcher.common.errors import UserError
from launcher.common.io import write_line
from launcher.run_dir.heartbeat_file import read_record, write_record
from launcher.run_dir.layout import RunDir

LOCK_ID_ENV = "ROFORMER_RUN_LOCK_ID"
"""The id of the lock `roformer pretrain` holds, given to its ranks (forwarded to every node like every
ROFORMER_* variable). Not named *TOKEN*: env forwarding drops credential-like names."""
REFRESH_SECONDS = 10.0
"""How often the holder and every member rewrite their refreshed_at (a rank guard on another node watches the
launcher's: launcher/launch/rank_process.py)."""
STALE_SECONDS = 600.0
MEMBER_GLOB = "job.rank*.json"


class RunDirInUse(UserError):
    """Another live job holds the run directory's lock; the message names it."""


@dataclass
class LockHolder:
    """The content of the lock file."""

    lock_id: str
    """Random id of this acquisition; the ranks of the holding job get it in LOCK_ID_ENV."""
    command: str
    """Who holds it: 'roformer pretrain' or 'rank 0' (a job started without roformer pretrain)."""
    host: str
    """socket.gethostname() of the holder."""
    pid: int
    """The holder's process id on `host`."""
    pid_started: int | None
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22): a reused pid differs."""
    started_at: float
    """time.time() when the lock was taken."""
    refreshed_at: float
    """time.time() of the latest refresh."""
    members: list[JobMember] = dataclasses.field(default_factory=list)
    """The ranks recorded beside the lock under this lock_id (read_holder fills it; not in the lock file)."""

    def describe(self, now: float | None = None) -> str:
        """"roformer pretrain (pid 4242 on node1, since 2026-11-25 03:50:12, refreshed 12 s ago)", plus
        "; it is gone, but its rank 1 (pid 4300 on node1) still runs" when only the job's ranks live."""
        age = max(0.0, (time.time() if now is None else now) - self.refreshed_at)
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started_at))
        text = f"{self.command} (pid {self.pid} on {self.host}, since {since}, refreshed {age:.0f} s ago)"
        live = live_member(self, now=now) if process_gone(self.host, self.pid, self.pid_started, self.refreshed_at,
                                                    STALE_SECONDS, now) else None
        if live is not None:
            text += f"; it is gone, but its rank {live.rank} (pid {live.pid} on {live.host}) still runs"
        return text


@dataclass
class JobMember:
    """One rank of the job holding the lock, as it recorded itself in heartbeats/job.rank<r>.json."""

    lock_id: str
    """The lock of the job it belongs to (LOCK_ID_ENV, or rank 0's own lock)."""
    rank: int
    """Global rank."""
    host: str
    """socket.gethostname() of its node."""
    pid: int
    """The rank's process id on `host`."""
    pid_started: int | None
    """Its start time in clock ticks since boot (a reused pid differs)."""
    refreshed_at: float
    """time.time() of its latest refresh (judged on other hosts, like the holder's)."""


def lock_path(run_dir: Path) -> Path:
    return RunDir(Path(run_dir)).heartbeats / "run.lock"


def read_holder(run_dir: Path, members: bool = True) -> LockHolder | None:
    """The current holder with its job's recorded ranks (`members`: False leaves them out), or None when there
    is no lock file."""
    return _read(lock_path(run_dir), with_members=members)


def member_path(run_dir: Path, rank: int) -> Path:
    return lock_path(run_dir).with_name(f"job.rank{rank}.json")


def process_start_ticks(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot; None when it does not exist (or no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])  # field 22; the name in (...) may hold spaces
    except (OSError, ValueError, IndexError):
        return None


def stale_reason(holder: LockHolder, stale_after: float = STALE_SECONDS, now: float | None = None) -> str | None:
    """Why `holder`'s job is gone (its lock may be taken over), or None while any process of it may still be
    running: the holder itself or one of its recorded ranks (`members`, from read_holder)."""
    if holder.pid <= 0:
        return "the file is not a lock record"
    reason = process_gone(holder.host, holder.pid, holder.pid_started, holder.refreshed_at, stale_after, now)
    if reason is None or live_member(holder, stale_after, now) is not None:
        return None
    ranks = [m for m in holder.members if m.lock_id == holder.lock_id]
    return reason + (f", nor is any of the {len(ranks)} rank(s) it recorded" if ranks else "")


def live_member(holder: LockHolder, stale_after: float = STALE_SECONDS, now: float | None = None) -> JobMember | None:
    """A recorded rank of `holder`'s job that may still be running, None when none."""
    return next((m for m in holder.members if m.lock_id == holder.lock_id
                 and process_gone(m.host, m.pid, m.pid_started, m.refreshed_at, stale_after, now) is None), None)


def local_ranks_alive(run_dir: Path, lock_id: str | None = None) -> list[JobMember]:
    """The recorded ranks on this host (of `lock_id`'s job; of any job when None) whose process still runs."""
    host = socket.gethostname()
    return [m for m in _members(lock_path(run_dir).parent) if m.host == host and lock_id in (None, m.lock_id)
            and process_gone(m.host, m.pid, m.pid_started, m.refreshed_at, STALE_SECONDS, None) is None]


def wait_for_local_ranks(run_dir: Path, lock_id: str, timeout: float) -> list[JobMember]:
    """Wait up to `timeout` s for this host's ranks of the job to end (after its launcher ended: one killed
    leaves ranks that stop on their own, still writing their checkpoint); those still running then."""
    deadline = time.monotonic() + timeout
    while (left := local_ranks_alive(run_dir, lock_id)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def process_gone(host: str, pid: int, pid_started: int | None, refreshed_at: float, stale_after: float,
          now: float | None) -> str | None:
    """Why the process `pid` on `host` is gone, None while it may run: on this host by its pid and start
    time; elsewhere by the age of its latest refresh."""
    now = time.time() if now is None else now
    if host == socket.gethostname():
        started = process_start_ticks(pid)
        if started is None and not pid_alive(pid):
            return f"pid {pid} is not running on {host}"
        if started is not None and pid_started is not None and started != pid_started:
            return f"pid {pid} on {host} is another process now"
        return None
    if now - refreshed_at > stale_after:
        return f"not refreshed for {now - refreshed_at:.0f} s (bound {stale_after:g} s)"
    return None


def _is_this_process(holder: LockHolder) -> bool:
    return (holder.host, holder.pid, holder.pid_started) == (socket.gethostname(), os.getpid(),
                                                             process_start_ticks(os.getpid()))


def pid_alive(pid: int) -> bool:
    """A process with this pid exists on this host (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunLock:
    """A held (or, for rank 0 under `roformer pretrain`, joined) run-directory lock."""

    def __init__(self, path: Path, holder: LockHolder, owned: bool, took_over: LockHolder | None = None,
                 refresh_every: float | None = REFRESH_SECONDS):
        self.path, self.holder, self.owned, self.took_over = path, holder, owned, took_over
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if owned and refresh_every:
            self._thread = threading.Thread(target=self._refresh_loop, args=(refresh_every,), name="run-lock",
                                            daemon=True)
            self._thread.start()

    def refresh(self) -> bool:
        """Rewrite refreshed_at; False (nothing written) when the file no longer holds this lock."""
        if not self.owned:
            return True
        with _guard(self.path):
            current = _read(self.path)
            if current is None or current.lock_id != self.holder.lock_id:
                return False
            self.holder = dataclasses.replace(self.holder, refreshed_at=time.time())
            tmp = self.path.with_name(f".{self.path.name}.{self.holder.lock_id}.tmp")
            tmp.write_text(_record(self.holder), encoding="utf-8")
            os.replace(tmp, self.path)  # atomic: readers see the old record or the new one
        return True

    def release(self) -> None:
        """Remove the lock file if it still holds this lock (idempotent); a joined lock is left alone."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if not self.owned:
            return
        self.owned = False
        with contextlib.suppress(OSError), _guard(self.path):
            current = _read(self.path)
            if current is not None and current.lock_id == self.holder.lock_id:
                self.path.unlink()

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def _refresh_loop(self, every: float) -> None:
        while not self._stop.wait(every):
            try:
                if not self.refresh():
                    print(f"warning: {self.path} no longer holds this job's lock (taken over as stale?); "
                          f"another job may now write this run directory", file=sys.stderr, flush=True)
                    return
            except OSError:
                pass  # a shared filesystem hiccup: the next refresh tries again, the bound is 10 intervals


def acquire(run_dir: Path, *, command: str = "roformer pretrain", lock_id: str | None = None,
            stale_after: float = STALE_SECONDS, refresh_every: float | None = REFRESH_SECONDS,
            note: Callable[[str], None] | None = None) -> RunLock:
    """Take RUN_DIR's lock (creating RUN_DIR/heartbeats, and RUN_DIR when missing).

    RunDirInUse naming the holder when another live job has it. `lock_id`: when the file already
    holds this id (rank 0 of the job `roformer pretrain` holds it for), the lock is joined, not
    taken: nothing is written, and release() leaves the file to its owner. A stale lock is taken
    over, and `note` (default: stderr) gets one line naming the holder that was gone and why."""
    root = Path(run_dir)
    made = _make_dirs(root)
    path = lock_path(root)
    note = note or (lambda text: print(text, file=sys.stderr, flush=True))
    try:
        lock = _take(root, path, command, lock_id, stale_after, refresh_every)
    except OSError as err:  # a read-only filesystem, a full disk: the guard or the lock file cannot be written
        _remove_made(made, path)
        from launcher.common.size_checks import full_disk_line

        raise UserError(full_disk_line(err, [("--run-dir", root)])
                        or f"--run-dir {root}: not writable: {err.strerror or err}") from None
    if lock.took_over is not None:
        note(f"--run-dir {root}: took over the lock of {lock.took_over.describe()}: "
             f"{stale_reason(lock.took_over, stale_after)}")
    return lock


@contextlib.contextmanager
def held_run_dir(run_dir: Path, rank: int) -> Iterator[None]:
    """RUN_DIR for as long as a pretraining rank runs (the rank entry's `with`): created when new, and on rank 0
    its lock, released on the way out however the rank ends. Under `roformer pretrain` the launcher holds the
    lock and passed its id in LOCK_ID_ENV: rank 0 finds it there and writes nothing (the launcher keeps it
    across restarts). A job started by plain mpirun / srun has no launcher: rank 0 takes the lock itself.
    Either way another live job's lock is refused (RunDirInUse, one line naming it) before the rank writes
    anything else."""
    if not run_dir.is_dir():  # checked by the rank's input checks: its parent exists
        try:
            (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
            probe = run_dir / f".write-test-{os.getpid()}"  # access(2) alone trusts a root that /proc refuses
            probe.write_text("ok")
            probe.unlink()
        except OSError as err:
            raise UserError(f"--run-dir {run_dir}: not writable ({err.strerror})") from None
    lock_id = os.environ.get(LOCK_ID_ENV) or None
    if rank != 0:
        with JobMembership.join(run_dir, rank, lock_id):
            yield
        return
    with acquire(run_dir, command="rank 0", lock_id=lock_id,
                 note=lambda text: write_line(f"pretrain (rank 0): note: {text}")) as lock, \
            JobMembership.join(run_dir, rank, lock.holder.lock_id):
        yield


class JobMembership:
    """This rank's record beside the lock (heartbeats/job.rank<r>.json): while it exists and its process
    lives, the job's lock is not stale even if the process that took it is gone. Refreshed every
    REFRESH_SECONDS (other hosts judge it by its age), removed when the rank ends."""

    def __init__(self, path: Path | None, member: JobMember | None, refresh_every: float | None = REFRESH_SECONDS):
        self.path, self.member = path, member
        self._stop = threading.Event()
        self._writing = threading.Lock()  # a refresh never re-creates the file after leave() removed it
        if path is not None and refresh_every:
            threading.Thread(target=self._refresh_loop, args=(refresh_every,), name="job-member",
                             daemon=True).start()

    @classmethod
    def join(cls, run_dir: Path, rank: int, lock_id: str | None,
             refresh_every: float | None = REFRESH_SECONDS) -> "JobMembership":
        """Record this rank under `lock_id` (nothing without one: a plain mpirun's rank > 0 does not know
        it). RunDirInUse when the lock is held by another job any process of which lives: a rank of a job
        whose lock was taken over (its launcher gone and judged stale) writes nothing."""
        if lock_id is None:
            return cls(None, None)
        path = lock_path(run_dir)
        _make_dirs(Path(run_dir))
        with _guard(path):
            current = _read(path, with_members=True)
            if current is not None and current.lock_id != lock_id and stale_reason(current) is None:
                raise RunDirInUse(f"--run-dir {run_dir}: in use by {current.describe()}; one job per run "
                                  f"directory: this job's lock was taken over (lock file {path})")
            member = JobMember(lock_id=lock_id, rank=rank, host=socket.gethostname(), pid=os.getpid(),
                               pid_started=process_start_ticks(os.getpid()), refreshed_at=time.time())
            write_record(member_path(run_dir, rank), member)
        return cls(member_path(run_dir, rank), member, refresh_every)

    def __enter__(self) -> "JobMembership":
        return self

    def __exit__(self, *exc) -> None:
        self.leave()

    def leave(self) -> None:
        """Remove the record if it is still this process's (idempotent)."""
        self._stop.set()
        with self._writing:
            if self.path is None:
                return
            with contextlib.suppress(OSError):
                current = read_record(self.path, JobMember)
                if current is not None and (current.pid, current.lock_id) == (self.member.pid, self.member.lock_id):
                    self.path.unlink()
            self.path = None

    def _refresh_loop(self, every: float) -> None:
        while not self._stop.wait(every):
            with self._writing, contextlib.suppress(OSError):
                if self.path is None:
                    return
                self.member = dataclasses.replace(self.member, refreshed_at=time.time())
                write_record(self.path, self.member)


def _take(root: Path, path: Path, command: str, lock_id: str | None, stale_after: float,
          refresh_every: float | None) -> RunLock:
    with _guard(path):
        current = _read(path, with_members=True)
        if current is not None and lock_id is not None and current.lock_id == lock_id:
            return RunLock(path, current, owned=False)
        took_over = None
        orphans = local_ranks_alive(root) if current is None else []
        if orphans:  # a job whose lock is gone (released under them) still has ranks writing here
            rank = orphans[0]
            raise RunDirInUse(f"--run-dir {root}: in use by rank {rank.rank} (pid {rank.pid} on {rank.host}) of a "
                              f"job whose lock is gone; one job per run directory: wait for it to end or stop it")
        if current is not None and _is_this_process(current):
            path.unlink()  # left by an earlier start in this very process (a test, a benchmark): ours
        elif current is not None:
            reason = stale_reason(current, stale_after)
            if reason is None:
                raise RunDirInUse(f"--run-dir {root}: in use by {current.describe()}; one job per run directory: "
                                  f"wait for it to end or stop it (lock file {path})")
            took_over = current
            path.unlink(missing_ok=True)
            for member in path.parent.glob(MEMBER_GLOB):  # of jobs no process of which is left
                member.unlink(missing_ok=True)
        now = time.time()
        holder = LockHolder(lock_id=lock_id or secrets.token_hex(8), command=command, host=socket.gethostname(),
                            pid=os.getpid(), pid_started=process_start_ticks(os.getpid()), started_at=now,
                            refreshed_at=now)
        if not _create(path, holder):  # someone without the guard (flock unsupported) was faster
            raise RunDirInUse(f"--run-dir {root}: in use by {(_read(path) or holder).describe()}; one job per "
                              f"run directory (lock file {path})")
    return RunLock(path, holder, owned=True, took_over=took_over, refresh_every=refresh_every)


def _make_dirs(root: Path) -> list[Path]:
    """RUN_DIR and RUN_DIR/heartbeats, with the words of launcher.launch.preflight.check_run_dir; the folders
    this call created, deepest first (a refused start removes them again: _remove_made)."""
    if root.exists() and not root.is_dir():
        raise UserError(f"--run-dir {root}: exists and is not a directory")
    made = [parent for parent in [root, *root.parents] if not parent.exists()]
    if not root.is_dir():
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            _remove_made(made, None)
            raise UserError(f"--run-dir {root}: cannot create it: {err.strerror or err}") from None
    heartbeats = RunDir(root).heartbeats
    if not heartbeats.exists():
        made.insert(0, heartbeats)
    try:
        heartbeats.mkdir(exist_ok=True)
    except OSError as err:
        _remove_made(made, None)
        raise UserError(f"--run-dir {root}: not writable: {err.strerror or err}") from None
    return made


def _remove_made(made: list[Path], lock: Path | None) -> None:
    """Undo a refused acquire: the guard file (when this call made heartbeats/) and the folders it made, while
    empty; a folder that holds anything else stays."""
    if lock is not None and made and made[0] == lock.parent:
        lock.with_name(f".{lock.name}.guard").unlink(missing_ok=True)
    for folder in made:
        with contextlib.suppress(OSError):
            folder.rmdir()


def _record(holder: LockHolder) -> str:
    """The lock file's content: the holder without its members (they have files of their own)."""
    return json.dumps({k: v for k, v in dataclasses.asdict(holder).items() if k != "members"})


def _read(path: Path, with_members: bool = False) -> LockHolder | None:
    try:
        holder = LockHolder(**{k: v for k, v in json.loads(path.read_text(encoding="utf-8")).items()
                               if k != "members"})
        if with_members:
            holder.members = _members(path.parent)
        return holder
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, AttributeError):
        # Not ours or unreadable: an empty/garbled file cannot name a live holder, so it counts as gone.
        return LockHolder(lock_id="?", command=f"unreadable lock file {path}", host="?", pid=0, pid_started=None,
                          started_at=0.0, refreshed_at=0.0)


def _members(heartbeats: Path) -> list[JobMember]:
    """Every readable rank record in heartbeats/, whatever job it belongs to."""
    found = (read_record(p, JobMember) for p in sorted(heartbeats.glob(MEMBER_GLOB)))
    return [m for m in found if m is not None]


def _create(path: Path, holder: LockHolder) -> bool:
    """Write `holder` to `path` only if `path` does not exist, atomically (content complete when it appears)."""
    tmp = path.with_name(f".{path.name}.{holder.lock_id}.tmp")
    try:
        tmp.write_text(_record(holder), encoding="utf-8")  # inside the try: a full disk leaves no half-written tmp
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def _guard(path: Path) -> Iterator[None]:
    """An exclusive flock on `.run.lock.guard` beside the lock while a holder is judged and replaced.
    Where the filesystem refuses locks (ENOLCK, some NFS mounts), the atomic create alone decides."""
    import fcntl

    fd = os.open(path.with_name(f".{path.name}.guard"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as err:
            if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                raise
        yield
    finally:
        os.close(fd)  # closing drops the flock

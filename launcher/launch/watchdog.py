"""The hang watchdog, run by every rank's wrapper process: stops a job whose ranks stopped making progress.

A rank blocked in a collective (a peer died silently, the network is partitioned: gloo notices
neither) or stopped by SIGSTOP cannot act itself, and a partitioned node's output never reaches
`roformer pretrain`. So the wrapper of every rank (launcher.launch.rank_process, a separate process on
the rank's node) watches its own rank's heartbeat (RUN_DIR/heartbeats/rank<r>.json, written by
launcher.train.heartbeats at every step and phase start, with the phase's bound):

1. Every POLL_SECONDS it publishes what it sees in RUN_DIR/heartbeats/rank<r>.guard.json (a
   GuardStatus: the rank's phase and step, seconds since its heartbeat, its process state from
   /proc, and, once the rank is overdue, whether this node can still open a TCP connection to rank 0's
   rendezvous port).
2. When its rank has been silent longer than the heartbeat's bound, it watches the other guards'
   statuses for SETTLE_SECONDS (a guard that updates nothing in that time counts as silent), then
   names the cause with `diagnose`, or takes the verdict a peer guard has already published (so all
   guards name the same ranks), publishes it in its status, prints one `[roformer-watchdog] {json}`
   line and SIGKILLs its rank: a hung rank cannot run a SIGTERM handler, and no checkpoint can be
   written without its peers, so the newest complete one stays the resume point. The guard exits
   with HUNG_EXIT_CODE, DeepSpeed's launcher stops the node's other ranks, and `roformer pretrain`
   reports the verdict (launcher.launch.supervise). The line of a partitioned node never arrives,
   but the guards on the other side name it from its status file.

Ages are measured on the node that wrote them (time.monotonic of the rank and its guard), so clock
skew between nodes does not matter. Each guard deletes its previous status when it starts, so the
status files it reads belong to this launch; a peer counts as live when its status changes.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from launcher.run_dir.heartbeat_file import Heartbeat, read_record, write_record
from launcher.run_dir.layout import RunDir

MARKER = "[roformer-watchdog]"
POLL_SECONDS = 2.0
SETTLE_SECONDS = 10.0  # > a few POLL_SECONDS: a live guard updates its status several times meanwhile
PROBE_TIMEOUT_SECONDS = 3.0
STOPPED_STATES = ("T", "t")  # stopped by a signal / by a debugger (/proc/PID/stat)
BUSY_STATES = {"R": "busy computing (process state R) while the other ranks wait for it",
               "D": "blocked in uninterruptible I/O (process state D: a filesystem or device does not answer)"}


@dataclass
class GuardStatus:
    """What one rank guard sees of its rank, published for the other guards."""

    rank: int
    local_rank: str
    node_rank: str
    host: str  # socket.gethostname() of the node
    seq: int  # counts the guard's writes: a status that stops changing belongs to a silent node
    rank_pid: int
    phase: str | None  # the rank's current phase ("train (step 57)"), None before its first heartbeat
    step: int | None
    silent_seconds: float | None  # since the rank's latest heartbeat
    bound_seconds: float | None  # the heartbeat's bound (None: not watched)
    process_state: str | None  # R running, S sleeping (e.g. waiting in a collective), D, T stopped, Z
    master_reachable: bool | None  # TCP connect to rank 0's rendezvous port; None = not probed
    verdict: dict | None = None  # set (a Verdict as a dict) when this guard stopped its rank as hung

    @property
    def overdue(self) -> bool:
        return self.bound_seconds is not None and self.silent_seconds is not None \
            and self.silent_seconds > self.bound_seconds


@dataclass
class PeerView:
    """Another guard's latest status as this guard sees it."""

    rank: int
    status: GuardStatus | None  # None: no status file (yet)
    live: bool  # the status changed while this guard was deciding


@dataclass
class Verdict:
    """The ranks that stopped the job's progress, and why."""

    ranks: list[int]
    reason: str
    phase: str | None  # the first culprit's phase (None when its guard is silent)
    silent_seconds: float | None
    bound_seconds: float | None
    local_ranks: list[str] = field(default_factory=list)
    node_ranks: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    reported_by: int | None = None  # the rank whose guard printed it

    def to_line(self) -> str:
        return f"{MARKER} {json.dumps(asdict(self))}"

    @classmethod
    def from_line(cls, text: str) -> "Verdict | None":
        """The verdict in a `[roformer-watchdog] {...}` line (anywhere in `text`), else None."""
        start = text.find(MARKER)
        if start < 0:
            return None
        try:
            return cls(**json.loads(text[start + len(MARKER):]))
        except (ValueError, TypeError):
            return None

    def what(self) -> str:
        """'stopped making progress in train step 58 for 31 s (bound 30 s): <reason>' (plus the
        other culprit ranks), to follow the first culprit's name."""
        others = f" (so did rank{'s' * (len(self.ranks) > 2)} {', '.join(map(str, self.ranks[1:]))})" \
            if self.ranks[1:] else ""
        where = f" in {self.phase}" if self.phase else ""
        silent = f" for {self.silent_seconds:.0f} s" if self.silent_seconds is not None else ""
        bound = f" (bound {self.bound_seconds:.0f} s)" if self.bound_seconds is not None else ""
        return f"stopped making progress{where}{silent}{bound}{others}: {self.reason}"


def diagnose(views: list[PeerView], master: str) -> Verdict:
    """Which ranks hold the job up, from every guard's status (this guard's own included, live).

    In order of evidence: a stopped process; a node that cannot reach rank 0's host; a rank behind
    the others (an earlier step, or no heartbeat yet); a rank busy or in I/O while the others sleep
    (waiting in a collective); a guard that updates nothing (node down or cut off from the shared run
    directory too: on NFS its updates may also show up late, hence this comes after the others);
    otherwise the rank silent the longest.
    """
    live = [v for v in views if v.live and v.status is not None]

    def pick(chosen: list[PeerView], reason: str) -> Verdict:
        chosen = sorted(chosen, key=lambda v: v.rank)
        first = chosen[0].status
        return Verdict(ranks=[v.rank for v in chosen], reason=reason,
                       phase=first.phase if first else None,
                       silent_seconds=first.silent_seconds if first else None,
                       bound_seconds=first.bound_seconds if first else None,
                       local_ranks=[v.status.local_rank if v.status else "?" for v in chosen],
                       node_ranks=[v.status.node_rank if v.status else "?" for v in chosen],
                       hosts=[v.status.host if v.status else "?" for v in chosen])

    stopped = [v for v in live if v.status.process_state in STOPPED_STATES]
    if stopped:
        return pick(stopped, "its process is stopped (SIGSTOP, SIGTSTP or a debugger; process state T)")
    cut_off = [v for v in live if v.status.master_reachable is False]
    if cut_off:
        return pick(cut_off, f"its node cannot reach rank 0's host {master} (network link down or partitioned)")
    progress = {v.rank: _progress_key(v.status) for v in live}
    if progress and min(progress.values()) < max(progress.values()):
        behind = [v for v in live if progress[v.rank] == min(progress.values())]
        ahead = max((v.status for v in live), key=_progress_key)
        return pick(behind, f"it is behind the other ranks ({_where(behind[0].status)}, while rank "
                            f"{ahead.rank} reached {_where(ahead)})")
    waiting = [v for v in live if v.status.process_state not in BUSY_STATES]
    busy = [v for v in live if v.status.process_state in BUSY_STATES]
    if busy and waiting:
        return pick(busy, BUSY_STATES[busy[0].status.process_state])
    silent = [v for v in views if not v.live]
    if silent:
        return pick(silent, "its rank guard stopped updating RUN_DIR/heartbeats (node down or frozen, or cut "
                            "off from the network and the shared run directory)")
    oldest = max(live, key=lambda v: v.status.silent_seconds or 0.0)
    return pick([oldest], "no rank shows a cause (all wait, all reachable); this one has been silent the longest")


def _progress_key(status: GuardStatus) -> float:
    """Orders ranks by progress. `step` counts completed steps: validation, checkpoint and stage
    switch after step k carry k, as does training step k+1 (1-based), which comes after them."""
    if status.phase is None:
        return -2  # not even started: no heartbeat yet
    if status.step is None:
        return -1  # start-up
    return status.step + (0.5 if status.phase.startswith("train") else 0.0)


def _where(status: GuardStatus) -> str:
    return status.phase or "start-up, before its first heartbeat"


def process_state(pid: int) -> str | None:
    """The state letter of a process from /proc/PID/stat (None where /proc is unavailable)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()[0]  # after "pid (comm) "; comm may contain spaces


def can_connect(host: str, port: int, timeout: float = PROBE_TIMEOUT_SECONDS) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def run_dir_from_args(args: list[str]) -> Path | None:
    """The `--run-dir` of a rank command line, None when it has none."""
    for i, arg in enumerate(args):
        if arg == "--run-dir" and i + 1 < len(args):
            return Path(args[i + 1])
        if arg.startswith("--run-dir="):
            return Path(arg.split("=", 1)[1])
    return None


class Watchdog:
    """The thread of one rank guard (see the module doc); `verdict` is set once it has stopped the rank."""

    def __init__(self, run_dir: RunDir, identity: dict[str, str], world_size: int, rank_pid: int,
                 master_addr: str, master_port: int, report: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic):
        self.run_dir, self.identity, self.world_size, self.rank_pid = run_dir, identity, world_size, rank_pid
        self.rank = int(identity["rank"])
        self.master = (master_addr, master_port)
        self.report, self.clock = report, clock
        self.verdict: Verdict | None = None
        self.beat: Heartbeat | None = None  # the rank's latest heartbeat read
        self.seq = 0
        self.deciding_since: float | None = None
        self.peer_seen: dict[int, tuple[int, bool]] = {}  # rank -> (last seq, changed while deciding)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hang-watchdog", daemon=True)

    @classmethod
    def for_rank(cls, rank_args: list[str], env: dict[str, str], identity: dict[str, str], rank_pid: int,
                 report: Callable[[str], None]) -> "Watchdog | None":
        """A watchdog for a rank command with `--run-dir` under a launcher that set RANK / WORLD_SIZE /
        MASTER_ADDR / MASTER_PORT; None otherwise (e.g. a guard around another module)."""
        run_dir = run_dir_from_args(rank_args)
        try:
            int(identity["rank"])
            world_size, port = int(env["WORLD_SIZE"]), int(env["MASTER_PORT"])
            addr = env["MASTER_ADDR"]
        except (KeyError, ValueError):
            return None
        if run_dir is None:
            return None
        return cls(RunDir(run_dir.expanduser().resolve()), identity, world_size, rank_pid, addr, port, report)

    def start(self) -> None:
        try:
            self.run_dir.guard_status(self.rank).unlink(missing_ok=True)  # a previous launch's
        except OSError:
            pass  # not there to delete, or the run directory is not ours to write: check() will say
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            if self.check():
                return

    def check(self) -> bool:
        """One look: publish our status; decide once our rank has been overdue for SETTLE_SECONDS
        (or at once when a peer guard has already decided). True when it stopped the rank."""
        status = self._own_status()
        if status is None:  # the rank has written no heartbeat yet (or the watchdog is off)
            return False
        self._publish(status)
        if not status.overdue:
            self.deciding_since = None
            return False
        now = self.clock()
        if self.deciding_since is None:
            self.deciding_since = now
            self.peer_seen = {}
        views = self._peer_views(status)
        decided = next((Verdict(**v.status.verdict) for v in views if v.status and v.status.verdict), None)
        if decided is None and now - self.deciding_since < SETTLE_SECONDS:
            return False
        self.verdict = decided or diagnose(views, f"{self.master[0]}:{self.master[1]}")
        self.verdict.reported_by = self.rank
        status.verdict = asdict(self.verdict)
        self._publish(status)
        self.report(self.verdict.to_line())
        try:
            os.kill(self.rank_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return True

    def _publish(self, status: GuardStatus) -> None:
        try:
            write_record(self.run_dir.guard_status(self.rank), status)
        except OSError:  # the run directory is unreachable from here: decide on what we know
            pass

    def _own_status(self) -> GuardStatus | None:
        beat = read_record(self.run_dir.heartbeat(self.rank), Heartbeat)
        if beat is not None and beat.pid == self.rank_pid:  # not a previous run's file
            self.beat = beat
        beat = self.beat  # unreadable now (the run directory is unreachable): the last one still counts
        if beat is None:
            return None
        state = process_state(self.rank_pid)
        silent = max(0.0, self.clock() - beat.monotonic)
        overdue = beat.bound_seconds is not None and silent > beat.bound_seconds
        self.seq += 1
        return GuardStatus(
            rank=self.rank, local_rank=self.identity.get("local_rank", "?"),
            node_rank=self.identity.get("node_rank", "?"), host=self.identity.get("host", "?"), seq=self.seq,
            rank_pid=self.rank_pid, phase=beat.describe_phase(), step=beat.step, silent_seconds=round(silent, 1),
            bound_seconds=beat.bound_seconds, process_state=state,
            master_reachable=can_connect(*self.master) if overdue else None)

    def _peer_views(self, own: GuardStatus) -> list[PeerView]:
        views = []
        for rank in range(self.world_size):
            if rank == self.rank:
                views.append(PeerView(rank, own, live=True))
                continue
            status = read_record(self.run_dir.guard_status(rank), GuardStatus)
            seq = status.seq if status is not None else -1
            previous = self.peer_seen.get(rank)
            changed = previous is not None and (previous[1] or previous[0] != seq)
            self.peer_seen[rank] = (seq, changed)
            views.append(PeerView(rank, status, live=changed))
        return views

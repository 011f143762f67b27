"""A rank ends with its launcher (issue 63): the rank guard (launcher.launch.rank_process) looks at the processes
that started its job, and when one is gone it stops its rank (checkpoint, exit) as a SIGTERM would.

Two launchers above a rank: its parent, DeepSpeed's per-node launcher (or mpirun's / srun's daemon), and
`roformer pretrain`, which runs DeepSpeed's in a session of its own, so killing the command's process group
(the OOM killer, a scheduler, `kill -9`) leaves the job running. The parent is its process id (a dead parent
re-parents us); `roformer pretrain` is the holder of the run directory's lock whose id the job was given
(LOCK_ID_ENV): on its own host its pid and start time, on another host its lock's refreshes, which must not stop
for LAUNCHER_SILENT_SECONDS (measured on this node's clock: skew does not count). PR_SET_PDEATHSIG stays as a
first notice, but it fires when the parent's *thread* ends and not at all for a grandparent.
"""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Callable

from launcher.run_dir.lock import LockHolder, process_gone, read_holder

LAUNCHER_SILENT_SECONDS = 120.0
"""Another host's `roformer pretrain` counts as gone when its lock's refresh (every REFRESH_SECONDS) has not
changed for this long: well above what NFS's attribute and name caches (up to 60 s) can hold back."""
LOOK_SECONDS = 1.0


class LauncherWatch:
    """look() says why a launcher of this rank is gone, None while they all run."""

    def __init__(self, parent: int, run_dir: Path | None, lock_id: str | None,
                 clock: Callable[[], float] = time.monotonic):
        self.parent, self.run_dir, self.lock_id, self.clock = parent, run_dir, lock_id, clock
        holder = read_holder(run_dir) if run_dir is not None and lock_id else None
        # Only the command's lock: a job started without it has rank 0 as holder, which is the rank itself.
        self.launcher: LockHolder | None = holder if holder is not None and holder.lock_id == lock_id \
            and holder.command == "roformer pretrain" else None
        self.refresh_seen = (self.launcher.refreshed_at, clock()) if self.launcher is not None else None
        self.next_look = 0.0

    def look(self) -> str | None:
        now = self.clock()
        if os.getppid() != self.parent:
            return f"its parent process (pid {self.parent}, the job's launcher on this node) is gone"
        if self.launcher is None or now < self.next_look:
            return None
        self.next_look = now + LOOK_SECONDS
        launcher = self.launcher
        what = f"{launcher.command} (pid {launcher.pid} on {launcher.host})"
        if launcher.host == socket.gethostname():
            reason = process_gone(launcher.host, launcher.pid, launcher.pid_started, launcher.refreshed_at,
                                  float("inf"), None)
            return f"its launcher {what} is gone: {reason}" if reason else None
        current = read_holder(self.run_dir, members=False)
        if current is None or current.lock_id != self.lock_id:
            return f"its launcher {what} no longer holds the run directory's lock"
        if current.refreshed_at != self.refresh_seen[0]:
            self.refresh_seen = (current.refreshed_at, now)
        elif now - self.refresh_seen[1] > LAUNCHER_SILENT_SECONDS:
            return (f"its launcher {what} stopped refreshing the run directory's lock "
                    f"{now - self.refresh_seen[1]:.0f} s ago (bound {LAUNCHER_SILENT_SECONDS:g} s)")
        return None

"""The run directory's lock belongs to the job (issue 63, item 1): its ranks record themselves beside it, the
lock is taken over only when no process of the job is left, a rank of a job whose lock another live job holds
writes nothing, and a rank's guard sees its launcher go (on its host by pid, elsewhere by the lock's refreshes).
Real processes stand for the launcher and the ranks; the real 2-rank job: tests/multirank/test_orphaned_job.py."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from launcher.common.defaults import stop_signals_to_handle
from launcher.launch.launcher_watch import LAUNCHER_SILENT_SECONDS, LauncherWatch
from launcher.run_dir.heartbeat_file import read_record
from launcher.run_dir.lock import (JobMember, JobMembership, RunDirInUse, acquire, lock_path, member_path,
                                   process_start_ticks, read_holder, stale_reason, wait_for_local_ranks)
from launcher.train.stop_signals import StopAnnouncer, StopSignals
from tests.support.helpers import REPO, hangup_at_default

HOST = os.uname().nodename


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def write_lock(run_dir, pid: int, host: str = HOST, lock_id: str = "feedfacefeedface", **fields) -> None:
    now = time.time()
    record = dict(lock_id=lock_id, command="roformer pretrain", host=host, pid=pid,
                  pid_started=process_start_ticks(pid) if host == HOST else 1, started_at=now - 60, refreshed_at=now)
    record.update(fields)
    lock_path(run_dir).parent.mkdir(parents=True, exist_ok=True)
    lock_path(run_dir).write_text(json.dumps(record))


def write_member(run_dir, rank: int, pid: int, host: str = HOST, lock_id: str = "feedfacefeedface",
                 refreshed_at: float | None = None) -> None:
    member = dict(lock_id=lock_id, rank=rank, host=host, pid=pid,
                  pid_started=process_start_ticks(pid) if host == HOST else 1,
                  refreshed_at=time.time() if refreshed_at is None else refreshed_at)
    member_path(run_dir, rank).write_text(json.dumps(member))


def test_a_launcher_gone_while_a_rank_of_its_job_lives_keeps_the_lock_then_it_is_taken_over(tmp_path):
    run_dir = tmp_path / "run"
    launcher = dead_pid()  # the CLI killed by SIGKILL: its lock file stays
    rank = sleeper()
    try:
        write_lock(run_dir, launcher)
        write_member(run_dir, 0, dead_pid())  # rank 0 gone already
        write_member(run_dir, 1, rank.pid)  # rank 1 trains on
        write_member(run_dir, 2, rank.pid, lock_id="0ther0ther0ther0")  # another job's record: not this job's
        holder = read_holder(run_dir)
        assert [m.rank for m in holder.members] == [0, 1, 2]
        assert stale_reason(holder) is None
        before = lock_path(run_dir).read_bytes()
        with pytest.raises(RunDirInUse) as refused:
            acquire(run_dir)
        message = str(refused.value)
        assert "\n" not in message and lock_path(run_dir).read_bytes() == before
        assert (f"in use by roformer pretrain (pid {launcher} on {HOST}, since " in message
                and f"; it is gone, but its rank 1 (pid {rank.pid} on {HOST}) still runs; one job per run "
                    "directory" in message), message
    finally:
        rank.kill()
        rank.wait()
    notes = []
    with acquire(run_dir, note=notes.append) as lock:
        assert lock.took_over.pid == launcher
        assert notes[0].endswith(f"pid {launcher} is not running on {HOST}, nor is any of the 2 rank(s) it "
                                 f"recorded"), notes
        assert not list(lock_path(run_dir).parent.glob("job.rank*.json"))  # the dead job's records went with it


def test_a_rank_on_another_host_counts_until_its_refresh_is_older_than_the_bound(tmp_path):
    run_dir = tmp_path / "run"
    write_lock(run_dir, dead_pid())
    write_member(run_dir, 3, 4242, host="node2", refreshed_at=time.time() - 60)
    assert stale_reason(read_holder(run_dir), stale_after=600) is None
    write_member(run_dir, 3, 4242, host="node2", refreshed_at=time.time() - 700)
    assert "nor is any of the 1 rank(s)" in stale_reason(read_holder(run_dir), stale_after=600)


def test_ranks_record_themselves_under_their_jobs_lock_and_leave_when_they_end(tmp_path):
    run_dir = tmp_path / "run"
    with acquire(run_dir, refresh_every=None) as lock:
        with JobMembership.join(run_dir, 1, lock.holder.lock_id, refresh_every=0.05) as joined:
            first = read_record(member_path(run_dir, 1), JobMember)
            assert (first.rank, first.pid, first.host, first.lock_id) == (1, os.getpid(), HOST, lock.holder.lock_id)
            time.sleep(0.3)
            assert read_record(member_path(run_dir, 1), JobMember).refreshed_at > first.refreshed_at  # refreshed
            assert json.loads(lock_path(run_dir).read_text()).keys().isdisjoint({"members"})
        assert joined.path is None and not member_path(run_dir, 1).exists()
        # A rank of another job (its launcher's lock was taken over by this live one) writes nothing.
        with pytest.raises(RunDirInUse, match=r"in use by roformer pretrain \(pid \d+ .*this job's lock was taken "
                                              r"over"):
            JobMembership.join(run_dir, 1, "0123456789abcdef")
        assert not member_path(run_dir, 1).exists()
    # Without a lock id (a plain mpirun's rank > 0) nothing is recorded.
    assert JobMembership.join(run_dir, 1, None).path is None and not member_path(run_dir, 1).exists()


def test_a_rank_guard_sees_its_launcher_go_on_its_host_and_by_the_locks_refreshes_elsewhere(tmp_path):
    run_dir = tmp_path / "run"
    launcher = sleeper()
    try:
        write_lock(run_dir, launcher.pid)
        watch = LauncherWatch(os.getppid(), run_dir, "feedfacefeedface")
        assert watch.look() is None
        launcher.kill()
        launcher.wait()
        watch.next_look = 0.0
        assert watch.look() == (f"its launcher roformer pretrain (pid {launcher.pid} on {HOST}) is gone: pid "
                                f"{launcher.pid} is not running on {HOST}")
    finally:
        launcher.kill()
    assert LauncherWatch(os.getppid(), run_dir, "0123456789abcdef").launcher is None  # not its job's lock
    assert "its parent process (pid 1," in LauncherWatch(1, run_dir, None).look()

    now = [1000.0]
    write_lock(run_dir, 4242, host="node1", refreshed_at=50.0)
    watch = LauncherWatch(os.getppid(), run_dir, "feedfacefeedface", clock=lambda: now[0])
    now[0] += LAUNCHER_SILENT_SECONDS - 1
    assert watch.look() is None
    write_lock(run_dir, 4242, host="node1", refreshed_at=60.0)  # refreshed: the count starts again
    now[0] += LAUNCHER_SILENT_SECONDS - 1
    assert watch.look() is None  # seen now
    now[0] += LAUNCHER_SILENT_SECONDS - 1
    assert watch.look() is None
    now[0] += 2
    assert watch.look().endswith(f"stopped refreshing the run directory's lock {LAUNCHER_SILENT_SECONDS + 1:.0f} s "
                                 f"ago (bound {LAUNCHER_SILENT_SECONDS:g} s)")
    lock_path(run_dir).unlink()
    watch.next_look = 0.0
    assert watch.look() == "its launcher roformer pretrain (pid 4242 on node1) no longer holds the run directory's lock"


def test_sighup_is_a_stop_unless_the_command_was_started_under_nohup():
    code = ("import signal; from launcher.common.defaults import stop_signals_to_handle as s; "
            "print(sorted(x.name for x in s()))")
    plain = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                           preexec_fn=hangup_at_default)  # as from a terminal, whatever started the suite
    nohup = subprocess.run(["nohup", sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                           timeout=60)
    assert plain.stdout.strip() == "['SIGHUP', 'SIGINT', 'SIGTERM']", plain.stderr
    assert nohup.stdout.strip() == "['SIGINT', 'SIGTERM']", nohup.stderr
    assert signal.SIGHUP in stop_signals_to_handle() or signal.getsignal(signal.SIGHUP) == signal.SIG_IGN


def test_a_stop_after_the_last_step_says_the_run_is_finishing_not_a_step_past_its_end():
    said = []
    signals = StopSignals()
    signals.announcer = StopAnnouncer(600.0, 0, said.append, lambda: 31, last_step=30)
    signals._on_signal(signal.SIGINT, None)
    signals.grace_timer.cancel()  # its end would exit this process
    assert said == ["stop requested (SIGINT) after the last step (30): the run is finishing"]
    said.clear()
    signals = StopSignals()
    signals.announcer = StopAnnouncer(600.0, 0, said.append, lambda: 12, last_step=30)
    signals._on_signal(signal.SIGHUP, None)
    signals.grace_timer.cancel()
    assert said == ["stop requested (SIGHUP): finishing step 12, then a checkpoint (within 600 s)"]


def test_ranks_left_after_their_lock_went_keep_the_run_dir_and_their_launcher_waits_for_them(tmp_path):
    """DeepSpeed's launcher killed: `roformer pretrain` sees its job end while the ranks still write their stop
    checkpoint; it waits for them (wait_for_local_ranks) before it releases the lock, and a start that finds
    no lock but a live rank of a job is refused all the same."""
    run_dir = tmp_path / "run"
    rank = sleeper()
    try:
        lock_path(run_dir).parent.mkdir(parents=True)
        write_member(run_dir, 1, rank.pid)
        write_member(run_dir, 0, dead_pid())
        with pytest.raises(RunDirInUse, match=rf"in use by rank 1 \(pid {rank.pid} on {HOST}\) of a job whose lock "
                                              r"is gone; one job per run directory"):
            acquire(run_dir)
        assert not lock_path(run_dir).exists()
        started = time.monotonic()
        assert [m.pid for m in wait_for_local_ranks(run_dir, "feedfacefeedface", 0.6)] == [rank.pid]
        assert time.monotonic() - started >= 0.6
        assert wait_for_local_ranks(run_dir, "0123456789abcdef", 5) == []  # another job's: nothing to wait for
    finally:
        rank.kill()
        rank.wait()
    assert wait_for_local_ranks(run_dir, "feedfacefeedface", 5) == []
    with acquire(run_dir, refresh_every=None):
        pass

"""One job per run directory (launcher/run_dir/lock.py): the lock file's writer and reader with real
processes as holders (a live one refuses, a dead one is taken over, saying so), rank 0 joining the lock
its launcher holds, and two processes racing for one lock. The real `roformer pretrain` jobs:
tests/multirank/test_run_dir_lock_job.py."""
from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time

import pytest

from launcher.run_dir.lock import (LOCK_ID_ENV, LockHolder, RunDirInUse, acquire, lock_path, process_start_ticks,
                                   read_holder)
from tests.support.helpers import REPO

HOLD = "import sys, time; from launcher.run_dir.lock import acquire; acquire(sys.argv[1]); print('held', flush=True); "


def holder_process(run_dir, then: str = "time.sleep(600)") -> subprocess.Popen:
    """Another process that takes RUN_DIR's lock, says 'held', then runs `then`."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD + then, str(run_dir)], cwd=REPO, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline() == "held\n"
    return proc


def test_a_live_holder_is_refused_in_one_line_naming_it(tmp_path):
    run_dir = tmp_path / "run"
    other = holder_process(run_dir)
    try:
        before = lock_path(run_dir).read_bytes()
        with pytest.raises(RunDirInUse) as refused:
            acquire(run_dir)
        message = str(refused.value)
        assert "\n" not in message
        assert f"in use by roformer pretrain (pid {other.pid} on {os.uname().nodename}, since " in message
        assert str(lock_path(run_dir)) in message
        assert lock_path(run_dir).read_bytes() == before  # the refusal wrote nothing
    finally:
        other.kill()
        other.wait()


def test_a_dead_holder_is_taken_over_saying_so(tmp_path):
    run_dir = tmp_path / "run"
    gone = holder_process(run_dir, then="import os; os._exit(0)")
    gone.wait()
    notes = []
    with acquire(run_dir, note=notes.append) as lock:
        assert lock.took_over is not None and lock.took_over.pid == gone.pid
        assert read_holder(run_dir).pid == os.getpid()
        assert len(notes) == 1 and f"took over the lock of roformer pretrain (pid {gone.pid}" in notes[0]
        assert notes[0].endswith(f"pid {gone.pid} is not running on {os.uname().nodename}")
    assert not lock_path(run_dir).exists()  # released


def write_holder(run_dir, **fields) -> None:
    now = time.time()
    holder = dict(lock_id="feedfacefeedface", command="roformer pretrain", host="node2", pid=4242, pid_started=1,
                  started_at=now - 3600, refreshed_at=now)
    holder.update(fields)
    lock_path(run_dir).parent.mkdir(parents=True, exist_ok=True)
    lock_path(run_dir).write_text(json.dumps(holder))


def test_another_hosts_holder_counts_until_its_refresh_is_older_than_the_bound(tmp_path):
    run_dir = tmp_path / "run"
    write_holder(run_dir, refreshed_at=time.time() - 60)
    with pytest.raises(RunDirInUse, match=r"pid 4242 on node2, since .*, refreshed 60 s ago"):
        acquire(run_dir, stale_after=600)
    write_holder(run_dir, refreshed_at=time.time() - 700)
    notes = []
    with acquire(run_dir, stale_after=600, note=notes.append):
        assert "not refreshed for 700 s (bound 600 s)" in notes[0]


def test_a_reused_pid_is_not_the_holder(tmp_path):
    """The pid is alive (this process) but started at another time than the holder's: another process."""
    run_dir = tmp_path / "run"
    write_holder(run_dir, host=os.uname().nodename, pid=os.getppid(),
                 pid_started=process_start_ticks(os.getppid()) + 1)
    notes = []
    with acquire(run_dir, note=notes.append):
        assert notes[0].endswith(f"pid {os.getppid()} on {os.uname().nodename} is another process now")


def test_rank_0_joins_its_launchers_lock_and_refuses_another(tmp_path):
    run_dir = tmp_path / "run"
    launcher = holder_process(run_dir)
    try:
        held = read_holder(run_dir)
        before = lock_path(run_dir).stat().st_mtime_ns
        joined = acquire(run_dir, command="rank 0", lock_id=held.lock_id)
        assert not joined.owned and joined.holder == held
        joined.release()  # leaves the launcher's lock alone
        assert read_holder(run_dir) == held and lock_path(run_dir).stat().st_mtime_ns == before
        with pytest.raises(RunDirInUse, match=f"pid {launcher.pid}"):
            acquire(run_dir, command="rank 0", lock_id="0123456789abcdef")  # another job's id
    finally:
        launcher.kill()
        launcher.wait()


def test_refresh_rewrites_the_time_and_stops_once_the_lock_is_taken_over(tmp_path):
    run_dir = tmp_path / "run"
    lock = acquire(run_dir, refresh_every=None)
    first = read_holder(run_dir).refreshed_at
    time.sleep(0.01)
    assert lock.refresh() and read_holder(run_dir).refreshed_at > first
    write_holder(run_dir)  # someone took it over (this one looked stale to them)
    assert not lock.refresh()
    lock.release()
    assert read_holder(run_dir).lock_id == "feedfacefeedface"  # not ours to remove


def _race(run_dir, start, results) -> None:
    start.wait()
    try:
        acquire(run_dir, refresh_every=None)
        results.put("won")
        time.sleep(2)  # hold it while the others try
    except RunDirInUse:
        results.put("refused")


def test_of_processes_racing_for_one_lock_exactly_one_wins(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    for round_ in range(3):
        run_dir = tmp_path / f"run{round_}"
        start, results = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_race, args=(run_dir, start, results)) for _ in range(4)]
        for proc in procs:
            proc.start()
        start.set()
        outcomes = sorted(results.get(timeout=60) for _ in procs)
        for proc in procs:
            proc.join(timeout=30)
        assert outcomes == ["refused", "refused", "refused", "won"]


def test_the_record_is_a_lock_holder_and_the_id_variable_is_forwarded(tmp_path):
    from launcher.launch.env_forwarding import forwarded_environment

    with acquire(tmp_path / "run", refresh_every=None) as lock:
        assert LockHolder(**json.loads(lock_path(tmp_path / "run").read_text())) == lock.holder
    env = forwarded_environment({LOCK_ID_ENV: "0123456789abcdef", "PATH": "/usr/bin"}, ranks_per_node=1)
    assert env[LOCK_ID_ENV] == "0123456789abcdef"  # reaches every node's ranks through .deepspeed_env

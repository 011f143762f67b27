"""A job owns its run directory while any of its processes lives, and its ranks end with their launcher (issue 63,
item 1). `roformer pretrain --num_gpus 2` in its own session, killed by SIGKILL to its process group (the OOM
killer, a scheduler): DeepSpeed's launcher and the ranks, in a session of their own, survive it. While they live
(held still by SIGSTOP, so the moment is certain) a second start on the run directory is refused in one line
naming a rank's host and pid, writing nothing. Let go, the rank guards see the launcher gone and stop their ranks
like a SIGTERM: within 30 s no process of the job is left, the newest checkpoint is the stop's and complete, and
the same command resumes it alone to the end with the uninterrupted run's losses (tests/conftest.py's trainer_run:
fp32, no dropout). SIGHUP to `roformer pretrain`: tests/multirank/test_stop_at_start.py."""
from __future__ import annotations

import os
import re
import signal
import time

import psutil

from launcher.checkpoint.catalogue import CheckpointCatalogue
from launcher.run_dir.layout import RunDir
from launcher.run_dir.lock import lock_path
from tests.support.helpers import (NO_DROPOUT, TINY_TOTAL_STEPS, events, free_port, metrics_steps, newest_checkpoint,
                                   roformer, roformer_env, start_roformer, tiny_run_config, train_losses)

KILL_AFTER_STEP = 3
GONE_WITHIN_SECONDS = 30.0


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def tree_state(root) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in [root, *root.rglob("*")]}


def test_a_killed_launchers_ranks_keep_the_run_dir_stop_with_a_checkpoint_and_resume_alone(tmp_path, tiny_data,
                                                                                          trainer_run):
    config = tiny_run_config(tmp_path, tiny_data, model=NO_DROPOUT, logging={"progress_bar": False})
    run_dir, log = tmp_path / "run", tmp_path / "first.out"

    def args() -> tuple[str, ...]:
        return ("pretrain", "--num_gpus", "2", "--master_port", str(free_port()), "--config", str(config),
                "--run-dir", str(run_dir), "--report-to", "none")

    first = start_roformer(*args(), env=roformer_env(), log=log)  # its own session, as `setsid` starts it
    job: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 300
        while max(metrics_steps(run_dir), default=0) < KILL_AFTER_STEP:
            assert first.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        job = psutil.Process(first.pid).children(recursive=True)  # DeepSpeed's launcher, the guards, the ranks
        for process in job:
            process.send_signal(signal.SIGSTOP)
        os.killpg(first.pid, signal.SIGKILL)  # the command's process group: the job is in another session
        assert first.wait(timeout=60) == -signal.SIGKILL

        before = tree_state(run_dir)
        second = roformer(*args(), timeout=300)
        assert tree_state(run_dir) == before  # refused before writing anything
        assert second.returncode == 2, (second.stdout + second.stderr)[-3000:]
        lines = [line for line in second.stderr.strip().splitlines() if ": warning: " not in line]  # the schedule's
        assert len(lines) == 1 and lines[0].startswith("roformer pretrain: error: --run-dir "), second.stderr
        named = re.search(rf"in use by roformer pretrain \(pid {first.pid} on {re.escape(os.uname().nodename)}, "
                          rf".*\); it is gone, but its rank \d \(pid (\d+) on {re.escape(os.uname().nodename)}\) "
                          rf"still runs; one job per run directory", lines[0])
        assert named and int(named.group(1)) in {p.pid for p in job}, lines[0]

        for process in job:
            process.send_signal(signal.SIGCONT)
        let_go = time.monotonic()
        while any(alive(p) for p in job) and time.monotonic() - let_go < GONE_WITHIN_SECONDS:
            time.sleep(0.2)
        ended_after = time.monotonic() - let_go
        assert not any(alive(p) for p in job), ([p.cmdline() for p in job if alive(p)],
                                                 RunDir(run_dir).launcher_log.read_text()[-3000:])
    finally:
        for process in job:
            if alive(process):
                process.send_signal(signal.SIGCONT)
                process.kill()
        if first.poll() is None:
            first.kill()
    launcher_log = RunDir(run_dir).launcher_log.read_text()
    assert re.search(rf"rank_process \(rank \d on .*\): its launcher roformer pretrain \(pid {first.pid} on .*\) is "
                     rf"gone: pid {first.pid} is not running on .*: stopping the rank", launcher_log), launcher_log
    (stopped,) = events(run_dir, "stopped")
    point = newest_checkpoint(run_dir)
    assert point is not None and point.sidecar.step == stopped["step"] >= KILL_AFTER_STEP, launcher_log[-3000:]
    assert point.tag in [e.tag for e in CheckpointCatalogue.scan(run_dir).complete()]

    third = roformer(*args(), timeout=300)
    assert third.returncode == 0, (third.stdout + third.stderr)[-3000:]
    assert "took over the lock" in third.stderr  # the dead job's, once no process of it was left
    assert [e["tag"] for e in events(run_dir, "resume")] == [point.tag]
    assert len(events(run_dir, "stopped")) == 1  # the orphaned ranks trained no further after the resume began
    expected, got = train_losses(trainer_run), train_losses(run_dir)
    assert sorted(got) == list(range(1, TINY_TOTAL_STEPS + 1))
    for step in range(1, TINY_TOTAL_STEPS + 1):
        assert abs(got[step] - expected[step]) <= 1e-6, (step, got[step], expected[step])
    assert not lock_path(run_dir).exists()
    print(f"\nlauncher killed after step {KILL_AFTER_STEP}: a second start refused, the orphaned ranks gone "
          f"{ended_after:.1f} s after they could run, stop checkpoint {point.tag}, resumed to step {TINY_TOTAL_STEPS}")

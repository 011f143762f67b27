"""A real hang on the two-node namespace cluster (tests/support/netns): rank 0 SIGSTOPped. The job ends by
itself with exit code 124 and a line naming the rank and node, leaves no process, and a re-run resumes from the
newest complete checkpoint to the end of the schedule.

The other hang, node2's cable pulled mid-run, is the chaos run's second fault (test_restarts_on_cluster.py):
the same watchdog line, its job's processes ending while node2 is cut off and the resume from the checkpoint the
line names are checked there, without a job of its own.
"""
from __future__ import annotations

import os
import signal
import time

import psutil

from launcher.common.defaults import HUNG_EXIT_CODE
from tests.support.helpers import events, metrics_steps, roformer, start_roformer, newest_checkpoint
from tests.support.netns.jobs import (
    cluster_env,
    cluster_hostfile,
    cluster_run_config,
    job_processes,
    wait_for_step,
)

HANG_AT_STEP = 14  # in the last stage, past its warm-up steps and the checkpoint at step 12


WIDE_STEPS = 30  # total 6 + 4 + 30 = 40 steps


# Test bounds: a tiny step takes well under a second here even on a loaded machine.
WATCHDOG_FLAGS = ["--set", "watchdog.min_step_seconds=20", "--set", "watchdog.phase_seconds=30"]


STOP_LIMIT_SECONDS = 300  # the limit; the target (under 120 s) is printed


def _rank_pid(cluster, node: str) -> int:
    """The training process (not its guard) in `node`'s namespace."""
    pids = [pid for pid in cluster.pids_in_nodes()[node]
            if "-m launcher.train.rank_entry --config" in " ".join(psutil.Process(pid).cmdline())]
    assert len(pids) == 1, pids
    return pids[0]


def test_sigstopped_rank_0_ends_the_job_naming_node1_and_the_run_resumes(cluster, tmp_path, data_dir):
    """Rank 0 SIGSTOPped on node1 at HANG_AT_STEP: the job (no --max-restarts) ends by itself with exit code 124
    and a line naming rank 0, node1 and the stopped process, leaves no process, and the same command run again
    resumes from the newest complete checkpoint, which the line named, to the end of the schedule."""
    config, run_dir, log = cluster_run_config(tmp_path, data_dir, wide_steps=WIDE_STEPS), tmp_path / "run", tmp_path / "hung.log"
    total = 6 + 4 + WIDE_STEPS
    args = ["pretrain", "--hostfile", str(cluster_hostfile(tmp_path)), "--config", str(config), "--run-dir", str(run_dir),
            *WATCHDOG_FLAGS]
    proc = start_roformer(*args, env=cluster_env(cluster), log=log)
    try:
        wait_for_step(proc, run_dir, HANG_AT_STEP, log)
        os.kill(_rank_pid(cluster, "node1"), signal.SIGSTOP)
        hung_at = time.monotonic()
        rc = proc.wait(timeout=STOP_LIMIT_SECONDS)
        stop_seconds = time.monotonic() - hung_at
    finally:
        if proc.poll() is None:
            proc.kill()
    output = log.read_text()
    assert rc == HUNG_EXIT_CODE, output[-4000:]
    deadline = time.monotonic() + 10  # the last processes being reaped
    while job_processes(run_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert job_processes(run_dir) == []  # every rank, guard and launcher of the job ended, on both nodes
    deadline = time.monotonic() + 150  # and the nodes' sshd sessions (ends as soon as they are gone)
    while any(cluster.pids_in_nodes().values()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert cluster.pids_in_nodes() == {"node1": [], "node2": []}
    point = newest_checkpoint(run_dir)
    assert point is not None and 12 <= point.sidecar.step < total, output[-4000:]  # the hang came after step 14
    assert f"the newest complete checkpoint is {point.sidecar.tag}: run the same command again" in output
    error = next(line for line in output.splitlines() if line.startswith("roformer pretrain: error: "))
    assert error.startswith("roformer pretrain: error: hung: rank 0 (local rank 0) on node node1: stopped making "
                            "progress in "), error
    assert "its process is stopped" in error
    assert stop_seconds <= STOP_LIMIT_SECONDS

    resumed_at = time.monotonic()
    second = roformer(*args, env=cluster_env(cluster), timeout=300)
    resume_seconds = time.monotonic() - resumed_at
    assert second.returncode == 0, (second.stdout + second.stderr)[-4000:]
    assert [e["step"] for e in events(run_dir, "resume")] == [point.sidecar.step]
    assert sorted(set(metrics_steps(run_dir))) == list(range(1, total + 1))
    assert newest_checkpoint(run_dir).sidecar.step == total
    assert cluster.pids_in_nodes() == {"node1": [], "node2": []}
    print(f"\nrank 0 SIGSTOPped on node1: job ended {stop_seconds:.1f} s after the fault (exit {rc}); the re-run "
          f"resumed at step {point.sidecar.step} and finished step {total} in {resume_seconds:.1f} s\n{error}")

"""The chaos test of issue 20 on the two-node namespace cluster (tests/support/netns): one run of
`roformer pretrain --hostfile H --max-restarts 3` meets, one after the other, a rank SIGKILLed on node2,
node2's cable pulled (the hang watchdog ends the job; the cable goes back during the backoff), and SIGTERM
to every process of the job on both nodes (a scheduler preempting it: the ranks checkpoint at the current
step). The run finishes by itself, each fault is in RUN_DIR/restarts.json, no process is left, and as no
node was dropped its final weights equal an uninterrupted run's within 1e-6 (dropout off, as in the
exact-resume tests).

The first two faults are also the cluster's checks of a killed rank and of a partitioned node (once tests of
their own in test_two_node.py and test_watchdog_on_cluster.py, each starting a job of its own): the console
names the rank, node and cause; the killed job ends on both nodes within 60 s; the hung job's processes end
while node2 is still cut off, and node2's sshd sessions once it is back; each restart resumes from the
checkpoint the error line named. The exit code 124 of a hang and the re-run by hand are in
test_watchdog_on_cluster.py.
"""
from __future__ import annotations

import os
import signal
import time

import numpy as np
import psutil
from safetensors.numpy import load_file

from launcher.run_dir.layout import RunDir
from launcher.run_dir.restart_records import read_restarts
from tests.support.helpers import TEST_RANK_ENTRY, events, metrics_steps, run_to_end, start_roformer
from tests.support.netns.jobs import (
    assert_nothing_left,
    cluster_env,
    cluster_hostfile,
    cluster_run_config,
    job_processes,
    wait_for_step,
)

WIDE_STEPS = 30  # total 6 + 4 + 30 = 40 steps, checkpoints every 4 steps and at the stage ends
TOTAL = 6 + 4 + WIDE_STEPS
FLAGS = ["--entry-module", "tests.support.rank_wrapper", "--set", "watchdog.min_step_seconds=20",
         "--set", "watchdog.phase_seconds=30", "--set", "restarts.backoff_seconds=5",
         "--set", "restarts.max_backoff_seconds=10",
         # Dropout off, as in the exact-resume tests (tests/multirank/test_resume.py): the weights compare exactly.
         "--set", "model.hidden_dropout_prob=0.0", "--set", "model.attention_probs_dropout_prob=0.0"]
FAULT_TIMEOUT = 300
KILL_DEADLINE_SECONDS = 60  # a killed rank stops the job on all nodes within this (docs/multinode.md)


def _job_pids(cluster, run_dir, node: str, what: str = "") -> list[int]:
    """The job's Python processes in `node`'s namespace (DeepSpeed's node launcher, guards, ranks; not the
    remote shell pdsh started them from)."""
    pids = []
    for pid in cluster.pids_in_nodes()[node]:
        try:
            process = psutil.Process(pid)
            cmdline = " ".join(process.cmdline())
            python = process.name().startswith("python")
        except psutil.Error:
            continue
        if python and f"--run-dir {run_dir}" in cmdline and what in cmdline:
            pids.append(pid)
    return pids


def _wait_for_records(proc, run_dir, count: int, log) -> None:
    deadline = time.monotonic() + FAULT_TIMEOUT
    while len(read_restarts(RunDir(run_dir))) < count:
        assert proc.poll() is None, f"ended (rc {proc.returncode}) before restart {count}:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"no restart {count} in {FAULT_TIMEOUT} s:\n{log.read_text()[-4000:]}"
        time.sleep(0.2)


def _left_of_the_ended_job(cluster, run_dir, roformer_pid: int, nodes: bool, seconds: float) -> list[str]:
    """What is left of the job the newest restart record ended, waiting up to `seconds` for processes being
    reaped: its processes working for run_dir (not `roformer pretrain` itself, which restarts it) and, with
    nodes=True, every process in the nodes' namespaces. Only processes started before the record was written
    count: the restart's own start a backoff (>= 5 s) later."""
    ended = RunDir(run_dir).restarts.stat().st_mtime + 1.0
    deadline = time.monotonic() + seconds
    while True:
        pids = {int(line.split(":", 1)[0]) for line in job_processes(run_dir)}
        if nodes:
            pids |= {pid for node_pids in cluster.pids_in_nodes().values() for pid in node_pids}
        pids.discard(roformer_pid)
        left = []
        for pid in sorted(pids):
            try:
                process = psutil.Process(pid)
                if process.create_time() < ended:
                    left.append(f"{pid}: {' '.join(process.cmdline())[:200]}")
            except psutil.Error:
                continue
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def test_a_run_with_three_faults_finishes_by_itself_with_the_weights_of_an_uninterrupted_run(cluster, tmp_path,
                                                                                              data_dir):
    config = cluster_run_config(tmp_path, data_dir, wide_steps=WIDE_STEPS)
    env = {**cluster_env(cluster), "ROFORMER_TEST_SAVE_LIVE_WEIGHTS": "1"}
    hostfile = cluster_hostfile(tmp_path)

    def pretrain_args(run_dir):
        return ["pretrain", "--hostfile", str(hostfile), "--launcher", "pdsh", "--config", str(config),
                "--run-dir", str(run_dir), *FLAGS]

    # The uninterrupted run: the same two ranks on one node (a warm local job: its weights are the two-node run's,
    # the tolerance below; the cluster's own start is what the chaos run tests).
    reference_dir = tmp_path / "reference"
    run_to_end(2, config, reference_dir, module=TEST_RANK_ENTRY, ROFORMER_TEST_SAVE_LIVE_WEIGHTS="1",
               extra_args=FLAGS[2:])  # its --set items

    run_dir, log = tmp_path / "run", tmp_path / "chaos.log"
    started = time.monotonic()
    proc = start_roformer(*pretrain_args(run_dir), "--max-restarts", "3", env=env, log=log)
    try:
        # 1. A rank SIGKILLed on node2 (the newest checkpoint: step 4).
        wait_for_step(proc, run_dir, 5, log)
        [victim] = _job_pids(cluster, run_dir, "node2", "-m tests.support.rank_wrapper --config")
        psutil.Process(victim).kill()  # SIGKILL: the rank cannot report anything itself
        killed_at = time.monotonic()
        _wait_for_records(proc, run_dir, 1, log)
        kill_stop_seconds = time.monotonic() - killed_at  # the record is written once the job has ended
        left_of_killed_job = _left_of_the_ended_job(cluster, run_dir, proc.pid, nodes=True, seconds=10)

        # 2. node2's cable pulled: the watchdog ends the job; the cable goes back in during the backoff.
        wait_for_step(proc, run_dir, 14, log, timeout=FAULT_TIMEOUT)
        cluster.set_link("node2", up=False)
        try:
            _wait_for_records(proc, run_dir, 2, log)
            # Node2's ranks, guards and launcher end by themselves, cut off; its sshd sessions only once TCP is back
            # (checked at the end). 8 s: inside restart 2's backoff (10 s), which must find the cable back in.
            left_of_hung_job = _left_of_the_ended_job(cluster, run_dir, proc.pid, nodes=False, seconds=8)
        finally:
            cluster.set_link("node2", up=True)

        # 3. SIGTERM to every process of the job on both nodes, as a scheduler preempting it.
        wait_for_step(proc, run_dir, 26, log, timeout=FAULT_TIMEOUT)
        for node in ("node1", "node2"):
            for pid in _job_pids(cluster, run_dir, node):
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        rc = proc.wait(timeout=3 * FAULT_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
        cluster.set_link("node2", up=True)
    seconds = time.monotonic() - started
    output = log.read_text()
    assert rc == 0, output[-5000:]
    records = read_restarts(RunDir(run_dir))
    assert [r.action for r in records] == ["restart"] * 3, records
    killed, hung, preempted = records
    assert (killed.kind, killed.node, killed.rank) == ("rank", "node2", 1)
    # The kill lands at step 5 or, on a busy machine, a step or two later (past the stage-end checkpoint at
    # 6): the restart starts from a checkpoint the run had when it failed (the newest intact one: test_restarts).
    assert killed.failed_at_step >= 5 and 4 <= killed.restarted_from_step <= killed.failed_at_step, killed
    assert killed.steps_lost == killed.failed_at_step - killed.restarted_from_step, killed
    assert killed.cause == "rank 1 (local rank 0) on node node2: killed by SIGKILL"
    assert (hung.kind, hung.node, hung.rank) == ("hung", "node2", 1) and hung.failed_at_step >= 14
    assert preempted.failed_at_step >= 26
    assert preempted.steps_lost == 0, preempted  # the ranks checkpointed at the step they were at
    assert all(r.world_size == 2 and r.excluded_nodes == [] for r in records)
    assert all(r.seconds_lost is not None for r in records)
    assert sorted(set(metrics_steps(run_dir))) == list(range(1, TOTAL + 1))
    assert output.count("roformer pretrain: restart ") == 3
    # Every restart resumed from the checkpoint its record names.
    assert [e["step"] for e in events(run_dir, "resume")] == [r.restarted_from_step for r in records]

    # The killed rank, as the console names it; the job ended on both nodes in time, nothing of it left.
    errors = [line for line in output.splitlines() if line.startswith("roformer pretrain: error: ")]
    killed_error, hung_error = errors[0], errors[1]  # in the order of the faults (the preemption is no error)
    assert "error: rank 1 (local rank 0) on node node2: killed by SIGKILL; the job was stopped on all nodes" \
        in killed_error, killed_error
    assert kill_stop_seconds <= KILL_DEADLINE_SECONDS, output[-5000:]
    assert left_of_killed_job == []
    # The pulled cable, as the watchdog names it; every rank, guard and launcher of the hung job ended, on both
    # nodes, while node2 was still cut off; the restart resumed from the checkpoint the line named (past the hang's
    # step-12 checkpoint).
    assert hung_error.startswith("roformer pretrain: error: hung: rank 1 (local rank 0) on node node2: stopped "
                                 "making progress in "), hung_error
    assert "its node cannot reach rank 0's host" in hung_error, hung_error
    assert f"the newest complete checkpoint is {hung.restarted_from_tag}: run the same command again" in hung_error
    assert 12 <= hung.restarted_from_step <= hung.failed_at_step, hung
    assert left_of_hung_job == []

    ours = load_file(str(run_dir / "reference.safetensors"))
    theirs = load_file(str(reference_dir / "reference.safetensors"))
    worst = max(float(np.max(np.abs(ours[k] - theirs[k]))) for k in theirs)
    assert worst <= 1e-6, worst
    deadline = time.monotonic() + 150  # node2's sshd sessions from the partition end once TCP is back
    while any(cluster.pids_in_nodes().values()) and time.monotonic() < deadline:
        time.sleep(1)
    assert_nothing_left(cluster, run_dir)
    print(f"\nchaos run: 3 faults, finished by itself in {seconds:.0f} s (the killed rank's job ended "
          f"{kill_stop_seconds:.1f} s after the kill); "
          + "; ".join(f"{r.kind} at step {r.failed_at_step} -> from {r.restarted_from_step}, "
                      f"{r.seconds_lost:.1f} s lost" for r in records) + f"; weights max |diff| {worst:.1e}")

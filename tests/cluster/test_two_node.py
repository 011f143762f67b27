"""Two nodes on one machine over real TCP: `roformer pretrain --hostfile H --launcher pdsh`.

Hosts node1/node2 are network namespaces behind a bridge, each with its own sshd (tests/support/netns/
cluster.py). The tiny schedule runs with one rank per node: past a stage boundary, stopped with
a checkpoint (SIGTERM to `roformer pretrain`, our own child; never to DeepSpeed's runner), resumed
by a second invocation; `roformer pretrain` itself killed by SIGKILL (issue 63) leaves no process of the
job on either node within 60 s, and the last checkpoint is the ranks' stop checkpoint, complete. Skipped only
when the kernel refuses network namespaces (the reason is printed).

A rank SIGKILLed on node2 (the job stops on both nodes within 60 s with an error naming node and rank, and no
process of the job is left) is the chaos run's first fault (test_restarts_on_cluster.py), which checks all of
that without a job of its own.
"""
from __future__ import annotations

import os
import re
import signal
import time

from launcher.checkpoint.catalogue import CheckpointCatalogue
from tests.support.helpers import events, metrics_steps, roformer, start_roformer, newest_checkpoint
from tests.support.netns.jobs import (
    assert_nothing_left,
    cluster_env,
    cluster_hostfile,
    cluster_run_config,
    job_processes,
    wait_for_step,
)

STOP_AFTER_STEP = 12  # past the 'long' stage (steps 7-10) and the checkpoint at step 12
KILL_DEADLINE_SECONDS = 60


def test_preflight_names_unreachable_node_and_unshared_run_dir(cluster, tmp_path, data_dir):
    config = cluster_run_config(tmp_path, data_dir, wide_steps=6)
    cluster.add_unreachable_host("node3")
    hostfile = tmp_path / "hostfile3"
    hostfile.write_text("node1 slots=1\nnode3 slots=1\n")
    result = roformer("pretrain", "--hostfile", str(hostfile), "--config", str(config), "--run-dir",
                      str(tmp_path / "run3"), env=cluster_env(cluster))
    assert result.returncode == 2, result.stderr
    assert f"node3 ({hostfile}:2)" in result.stderr and "node1" not in result.stderr.split("not reachable")[1]

    hidden = tmp_path / "not-shared"
    hidden.mkdir()
    cluster.hide_directory_on("node2", hidden)
    result = roformer("pretrain", "--hostfile", str(cluster_hostfile(tmp_path)), "--config", str(config), "--run-dir",
                      str(hidden / "run"), env=cluster_env(cluster))
    assert result.returncode == 2, result.stderr
    assert "host node2 does not see the files written on this machine" in result.stderr
    assert not (hidden / "run" / ".deepspeed_env").exists()  # nothing was launched
    assert cluster.pids_in_nodes() == {"node1": [], "node2": []}


def test_two_nodes_train_past_a_stage_boundary_stop_and_resume(cluster, tmp_path, data_dir):
    # 60 wide steps: the stop lands a few steps after the SIGTERM (9 here at load 7); the resume trains the rest.
    config = cluster_run_config(tmp_path, data_dir, wide_steps=60)
    total = 6 + 4 + 60
    run_dir, hostfile = tmp_path / "run", cluster_hostfile(tmp_path)
    args = ["pretrain", "--hostfile", str(hostfile), "--launcher", "pdsh", "--config", str(config),
            "--run-dir", str(run_dir)]
    started = time.monotonic()
    first_log = tmp_path / "first.log"
    proc = start_roformer(*args, env=cluster_env(cluster), log=first_log)
    try:
        wait_for_step(proc, run_dir, STOP_AFTER_STEP, first_log)
        proc.send_signal(signal.SIGTERM)  # `roformer pretrain` itself: it asks the ranks to checkpoint and stop
        first_rc = proc.wait(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    first_seconds = time.monotonic() - started
    output = first_log.read_text()
    assert first_rc == 128 + signal.SIGTERM, output[-4000:]
    assert re.search(r"^node1: ", output, re.M) and re.search(r"^node2: ", output, re.M)
    assert (run_dir / ".deepspeed_env").read_text().count("GLOO_SOCKET_IFNAME=eth1\n") == 1
    point = newest_checkpoint(run_dir)
    assert point is not None and STOP_AFTER_STEP <= point.sidecar.step < total, output[-4000:]
    stopped_at = point.sidecar.step
    assert_nothing_left(cluster, run_dir)

    started = time.monotonic()
    second = roformer(*args, env=cluster_env(cluster), timeout=240)
    second_seconds = time.monotonic() - started
    assert second.returncode == 0, (second.stdout + second.stderr)[-4000:]
    resume = events(run_dir, "resume")
    assert [(e["step"], e["world_size"]) for e in resume] == [(stopped_at, 2)]
    steps = metrics_steps(run_dir)
    assert steps == list(range(1, total + 1))  # every step once: the resume continued, not restarted
    assert newest_checkpoint(run_dir).sidecar.step == total
    assert_nothing_left(cluster, run_dir)
    print(f"\ntwo-node run: first invocation {first_seconds:.1f} s (stopped at step {stopped_at}), "
          f"resume to step {total}: {second_seconds:.1f} s")


def test_a_killed_launcher_stops_the_job_on_both_nodes_with_a_checkpoint(cluster, tmp_path, data_dir):
    """The launching machine's `roformer pretrain` killed (the OOM killer): DeepSpeed's runner, pdsh and the nodes'
    launchers are in another session and survive it; the rank guards see their launcher gone and stop their
    ranks like a SIGTERM, so the job ends on both nodes with a stop checkpoint and nothing is left."""
    config = cluster_run_config(tmp_path, data_dir, wide_steps=5000)
    run_dir, log = tmp_path / "run", tmp_path / "orphaned.log"
    proc = start_roformer("pretrain", "--hostfile", str(cluster_hostfile(tmp_path)), "--launcher", "pdsh",
                          "--config", str(config), "--run-dir", str(run_dir), env=cluster_env(cluster), log=log)
    try:
        wait_for_step(proc, run_dir, 3, log)
        os.killpg(proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        proc.wait(timeout=30)
        while (any(cluster.pids_in_nodes().values()) or job_processes(run_dir)) and \
                time.monotonic() - killed_at < KILL_DEADLINE_SECONDS:
            time.sleep(0.2)
        stop_seconds = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
    launcher_log = (run_dir / "logs" / "launcher.log").read_text()
    assert_nothing_left(cluster, run_dir)
    assert stop_seconds <= KILL_DEADLINE_SECONDS, launcher_log[-3000:]
    assert len(re.findall(rf"its launcher roformer pretrain \(pid {proc.pid} on .*\) is gone", launcher_log)) >= 1
    (stopped,) = events(run_dir, "stopped")
    point = newest_checkpoint(run_dir)
    assert point is not None and point.sidecar.step == stopped["step"] >= 3, launcher_log[-3000:]
    assert point.tag in [e.tag for e in CheckpointCatalogue.scan(run_dir).complete()]
    print(f"\nroformer pretrain SIGKILLed: the job stopped on both nodes {stop_seconds:.1f} s later, checkpoint "
          f"{point.tag}")

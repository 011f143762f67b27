"""Runs on the two-node namespace cluster (tests/support/netns/cluster.py): the tiny schedule's config, a
hostfile with one rank per node, the client environment, waiting for a step, and the job's leftovers."""
from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from tests.support.helpers import (
    metrics_steps,
    roformer_env,
    tiny_run_config,
    write_schedule,
)
from tests.support.netns.cluster import TwoNodeCluster


def cluster_run_config(root: Path, data_dir: Path, wide_steps: int) -> Path:
    """The tiny three-stage schedule with a longer last stage (so a run can be stopped inside it)."""
    config = tiny_run_config(root, data_dir)
    write_schedule(root / "tiny_schedule.yaml", [
        {"name": "short", "max_seq_len": 32, "global_batch_size": 8, "steps": 6},
        {"name": "long", "max_seq_len": 64, "global_batch_size": 8, "steps": 4},
        {"name": "wide", "max_seq_len": 16, "global_batch_size": 16, "steps": wide_steps},
    ])
    return config


def cluster_hostfile(root: Path) -> Path:
    path = root / "hostfile"
    path.write_text("# two network namespaces, one rank each\nnode1 slots=1\nnode2 slots=1\n")
    return path


def cluster_env(cluster: TwoNodeCluster) -> dict[str, str]:
    return cluster.client_env(roformer_env(OMP_NUM_THREADS="1"))


def wait_for_step(proc, run_dir: Path, step: int, log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if max(metrics_steps(run_dir), default=0) >= step:
            return
        if proc.poll() is not None:
            pytest.fail(f"run ended (rc {proc.returncode}) before step {step}:\n{log.read_text()[-4000:]}")
        time.sleep(0.2)
    pytest.fail(f"step {step} not reached in {timeout} s:\n{log.read_text()[-4000:]}")


def job_processes(run_dir: Path) -> list[str]:
    """Every process on the machine (all namespaces share the PID space) still working for run_dir."""
    left = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if f"--run-dir {run_dir}" in cmdline:
            left.append(f"{proc.info['pid']}: {cmdline[:200]}")
    return left


def assert_nothing_left(cluster: TwoNodeCluster, run_dir: Path) -> None:
    deadline = time.monotonic() + 10  # processes being reaped right now
    while time.monotonic() < deadline and (any(cluster.pids_in_nodes().values()) or job_processes(run_dir)):
        time.sleep(0.2)
    assert cluster.pids_in_nodes() == {"node1": [], "node2": []}
    assert job_processes(run_dir) == []

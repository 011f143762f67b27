"""Two ranks through `roformer pretrain --launcher mpich` and `--launcher slurm`, for real.

MPICH (Debian `mpich`, installed beside Open MPI, which stays the system `mpirun`): DeepSpeed's
MPICH runner calls plain `mpirun`, so the tests put a directory first on PATH whose `mpirun` runs
`mpirun.mpich` (a script, not a symlink: Hydra looks for its proxy beside argv[0]). Ranks find
RANK/LOCAL_RANK from MPICH's PMI_RANK/MPI_LOCALRANKID through DeepSpeed's launcher_helper, which
also gets WORLD_SIZE/MASTER_ADDR/MASTER_PORT as `-genv`; mpi4py (built against Open MPI) is not used.

Slurm (Debian `slurm-wlm`): a one-node cluster (`slurmctld` + `slurmd`, tests/support/slurm_cluster.py)
is started for the module; DeepSpeed's Slurm runner runs `srun -n 2 ...` and each rank takes its
numbers from SLURM_PROCID / SLURM_STEP_NUM_TASKS / SLURM_LOCALID and rank 0's host from the step's
node list (launcher.launch.rank_process). Real DeepSpeed engines train the tiny three-stage schedule.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.support.helpers import REPO, TINY_TOTAL_STEPS, free_port, metrics_steps, roformer, roformer_env, \
    tiny_data_dir, tiny_run_config
from tests.support.slurm_cluster import SlurmCluster, SlurmUnavailable

MPICH_MPIRUN = "/usr/bin/mpirun.mpich"  # Debian's name for MPICH's mpirun (Hydra) beside Open MPI's
DISTRIBUTED_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_SIZE")
RUN_TIMEOUT_SECONDS = 240


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    root = tmp_path_factory.mktemp("launchers")
    return tiny_run_config(root, tiny_data_dir(tmp_path_factory))


@pytest.fixture
def hostfile(tmp_path) -> Path:
    path = tmp_path / "hostfile"
    path.write_text("localhost slots=2\n")
    return path


def _env(**extra: str) -> dict[str, str]:
    env = roformer_env(OMP_NUM_THREADS="1", **extra)
    for name in DISTRIBUTED_VARIABLES:  # nothing may come from outside: the launcher's discovery must find it
        env.pop(name, None)
    return env


@pytest.fixture
def mpich_env(tmp_path) -> dict[str, str]:
    """Environment whose `mpirun` is MPICH's, as on a machine where MPICH is the MPI."""
    if not os.access(MPICH_MPIRUN, os.X_OK):
        pytest.fail(f"{MPICH_MPIRUN} is not installed (Debian mpich; scripts/setup.sh installs it)")
    bin_dir = tmp_path / "mpich-bin"
    bin_dir.mkdir()
    mpirun = bin_dir / "mpirun"
    mpirun.write_text(f'#!/bin/sh\nexec {MPICH_MPIRUN} "$@"\n')
    mpirun.chmod(0o755)
    return _env(PATH=f"{bin_dir}:{os.environ.get('PATH', os.defpath)}")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    try:
        with SlurmCluster(tmp_path_factory.mktemp("slurm"), cpus=2) as cluster:
            yield cluster
    except SlurmUnavailable as err:
        if "not installed" in str(err):
            pytest.fail(str(err))
        pytest.skip(f"a one-node Slurm cluster cannot run here: {err}")


def _assert_trained_with_two_ranks(run_dir: Path, output: str) -> None:
    assert json.loads((run_dir / "stages.json").read_text())["world_size"] == 2, output[-3000:]
    assert metrics_steps(run_dir) == list(range(1, TINY_TOTAL_STEPS + 1)), output[-3000:]
    # Each rank writes its own ZeRO optimizer shard and RNG state: proof that two distinct ranks ran.
    checkpoints = run_dir / "checkpoints"
    newest = checkpoints / (checkpoints / "latest").read_text().strip()
    for rank in (0, 1):
        assert (newest / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").is_file(), sorted(os.listdir(newest))
        assert (newest / f"rng_rank{rank}.pt").is_file(), sorted(os.listdir(newest))


def _processes_of(run_dir: Path) -> list[str]:
    """Command lines of live processes that name this run directory (ranks, guards, launchers)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if str(run_dir) in cmdline and proc.pid != os.getpid():
            found.append(f"{proc.pid}: {cmdline[:200]}")
    return found


def _pretrain(launcher: str, hostfile: Path, config: Path, run_dir: Path, env: dict[str, str], *extra: str):
    result = roformer("pretrain", "--hostfile", str(hostfile), "--launcher", launcher, "--master_port",
                      str(free_port()), "--config", str(config), "--run-dir", str(run_dir), *extra, env=env,
                      timeout=RUN_TIMEOUT_SECONDS)
    return result, result.stdout + result.stderr


# ---- MPICH ------------------------------------------------------------------------------------
def test_mpich_dry_run_starts_the_guard_by_path_through_launcher_helper(config, hostfile, mpich_env, tmp_path):
    run_dir = tmp_path / "run"
    result, output = _pretrain("mpich", hostfile, config, run_dir, mpich_env, "--dry-run")
    assert result.returncode == 0, output[-3000:]
    command = next(line for line in output.splitlines() if "[this machine] mpirun " in line)
    for part in ("mpirun -n 2 -ppn 2 ", "-genv WORLD_SIZE 2", "-genv MASTER_ADDR 127.0.0.1", "-hosts localhost",
                 "launcher_helper.py --launcher mpich "):
        assert part in command, command
    # DeepSpeed's MPICH runner puts `-m` before the helper's path when given --module, which Python
    # cannot run ("No module named /...launcher_helper.py"): the guard must be passed as a file.
    assert not re.search(r" -m \S*launcher_helper\.py", command), command
    assert re.search(r"launcher_helper\.py --launcher mpich \S*rank_process\.py ", command), command
    assert not run_dir.exists()  # a dry run writes nothing


@pytest.mark.parametrize("launcher", ["mpich", "openmpi"])
def test_mpi_launcher_refuses_the_other_mpis_mpirun(launcher, config, hostfile, mpich_env, tmp_path):
    """Open MPI's mpirun for --launcher mpich (Debian's default) or MPICH's for openmpi: one line, nothing started."""
    env = mpich_env if launcher == "openmpi" else _env()
    run_dir = tmp_path / "run"
    result, output = _pretrain(launcher, hostfile, config, run_dir, env)
    assert result.returncode == 2, output[-3000:]
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and f"--launcher {launcher}" in errors[0] and "mpirun" in errors[0], result.stderr[-3000:]
    assert "deepspeed.launcher.runner" not in output  # refused before DeepSpeed's runner started
    assert not (run_dir / "stages.json").exists()


def test_roformer_pretrain_launcher_mpich(config, hostfile, mpich_env, tmp_path):
    run_dir = tmp_path / "run"
    result, output = _pretrain("mpich", hostfile, config, run_dir, mpich_env)
    assert result.returncode == 0, output[-3000:]
    runner_log = (run_dir / "logs" / "launcher.log").read_text()  # the console filters the runner's chatter
    assert "cmd = mpirun -n 2 -ppn 2 " in runner_log, runner_log[-3000:]
    _assert_trained_with_two_ranks(run_dir, output)
    assert _processes_of(run_dir) == []


def test_mpich_killed_rank_is_named_and_the_job_ends(config, hostfile, mpich_env, tmp_path):
    """As above under MPICH, where DeepSpeed's launcher_helper exits 0 whatever its rank did: the
    guard's line is what makes the job fail."""
    run_dir = tmp_path / "run"
    env = {**mpich_env, "ROFORMER_TEST_SIGKILL_AT": "1:3"}
    result, output = _pretrain("mpich", hostfile, config, run_dir, env, "--entry-module", "tests.support.rank_wrapper")
    assert result.returncode != 0, output[-3000:]
    assert "error: rank 1 (local rank 1) on node localhost: killed by SIGKILL" in result.stderr, output[-3000:]
    assert _processes_of(run_dir) == []


# ---- Slurm ------------------------------------------------------------------------------------
def test_slurm_cluster_fixture_runs_two_tasks(slurm):
    """The fixture itself: srun places two tasks with distinct SLURM_PROCIDs on the node."""
    result = subprocess.run(["srun", "-n", "2", "sh", "-c", "echo task=$SLURM_PROCID of=$SLURM_STEP_NUM_TASKS"],
                            env=slurm.client_env(), capture_output=True, text=True, timeout=60,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.split()) == ["of=2", "of=2", "task=0", "task=1"], result.stdout


def test_slurm_dry_run_starts_the_guard_by_path(config, hostfile, slurm, tmp_path):
    run_dir = tmp_path / "run"
    result, output = _pretrain("slurm", hostfile, config, run_dir, slurm.client_env(_env()), "--dry-run")
    assert result.returncode == 0, output[-3000:]
    command = next(line for line in output.splitlines() if "[this machine] srun " in line)
    assert command.split("] ", 1)[1].startswith("srun -n 2 --export=ALL,"), command
    assert re.search(r"MASTER_PORT=\d+", command), command
    # DeepSpeed's Slurm runner drops --module (`python -u launcher.launch.rank_process`: "can't open file"):
    # the guard must be passed as a file.
    assert re.search(r" -u \S*rank_process\.py ", command), command
    assert not run_dir.exists()


def test_roformer_pretrain_launcher_slurm_inside_an_allocation(config, hostfile, slurm, tmp_path):
    """As on a cluster: `salloc -n 2 roformer pretrain --launcher slurm ...`, whose srun runs in the allocation."""
    run_dir = tmp_path / "run"
    jobs_before = {job["JobId"] for job in slurm.job_records()}
    cmd = ["salloc", "--quiet", "-n", "2", "--", sys.executable, "-m", "launcher", "pretrain", "--hostfile",
           str(hostfile), "--launcher", "slurm", "--master_port", str(free_port()), "--config", str(config),
           "--run-dir", str(run_dir)]
    result = subprocess.run(cmd, cwd=REPO, env=slurm.client_env(_env()), capture_output=True, text=True,
                            timeout=RUN_TIMEOUT_SECONDS, stdin=subprocess.DEVNULL)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    runner_log = (run_dir / "logs" / "launcher.log").read_text()  # the console filters the runner's chatter
    assert "cmd = srun -n 2 " in runner_log, runner_log[-3000:]
    _assert_trained_with_two_ranks(run_dir, output)
    # The ranks ran as the allocation's two tasks, and the allocation completed.
    jobs = [job for job in slurm.job_records() if job["JobId"] not in jobs_before]
    assert len(jobs) == 1, jobs
    job = slurm.finished_job(jobs[0]["JobId"])
    assert (job["JobState"], job["NumTasks"], job["ExitCode"]) == ("COMPLETED", "2", "0:0"), job
    assert slurm.jobs() == [] and _processes_of(run_dir) == []


def test_slurm_killed_rank_is_named_and_the_job_ends(config, hostfile, slurm, tmp_path):
    """Rank 1 SIGKILLs itself before step 3: named (rank, node, signal), non-zero exit, nothing left.
    Outside an allocation: DeepSpeed's `srun` allocates the job itself."""
    run_dir = tmp_path / "run"
    env = slurm.client_env(_env(ROFORMER_TEST_SIGKILL_AT="1:3"))
    result, output = _pretrain("slurm", hostfile, config, run_dir, env, "--entry-module", "tests.support.rank_wrapper")
    assert result.returncode != 0, output[-3000:]
    assert "error: rank 1 (local rank 1) on node localhost: killed by SIGKILL" in result.stderr, output[-3000:]
    assert slurm.jobs() == [] and _processes_of(run_dir) == []

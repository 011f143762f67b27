"""Two ranks under OpenMPI: `mpirun` directly, and `roformer pretrain --launcher openmpi`.

Neither sets RANK/WORLD_SIZE/MASTER_*; DeepSpeed's MPI discovery (mpi4py) finds them (run by
launcher.launch.rank_process before the trainer starts). Real DeepSpeed engines train the tiny schedule.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from tests.support.helpers import REPO, free_port, metrics_steps, roformer, roformer_env, tiny_data_dir, \
    tiny_run_config

TINY_TOTAL_STEPS = 16
DISTRIBUTED_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_SIZE")


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    if shutil.which("mpirun") is None:
        pytest.fail("mpirun is not installed (Debian openmpi-bin; scripts/setup.sh installs it)")
    root = tmp_path_factory.mktemp("mpi")
    return tiny_run_config(root, tiny_data_dir(tmp_path_factory))


def _mpi_env() -> dict[str, str]:
    env = roformer_env(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    for name in DISTRIBUTED_VARIABLES:  # nothing may come from a launcher: MPI discovery must find it
        env.pop(name, None)
    return env


def _assert_trained_with_two_ranks(run_dir, output: str) -> None:
    assert json.loads((run_dir / "stages.json").read_text())["world_size"] == 2, output[-3000:]
    assert metrics_steps(run_dir) == list(range(1, TINY_TOTAL_STEPS + 1)), output[-3000:]


def test_mpirun_directly(config, tmp_path):
    run_dir = tmp_path / "run"
    env = _mpi_env()
    forwarded = ["DS_ACCELERATOR", "OMP_NUM_THREADS", "PYTHONPATH", "TORCH_EXTENSIONS_DIR", "TOKENIZERS_PARALLELISM"]
    cmd = ["mpirun", "--allow-run-as-root", "-np", "2", "--mca", "btl_tcp_if_include", "lo",
           "--mca", "oob_tcp_if_include", "lo", *[arg for name in forwarded for arg in ("-x", name)],
           "-x", f"MASTER_PORT={free_port()}",
           sys.executable, "-u", "-m", "launcher.launch.rank_process", "launcher.train.rank_entry",
           "--config", str(config), "--run-dir", str(run_dir)]
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                            stdin=subprocess.DEVNULL)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    _assert_trained_with_two_ranks(run_dir, output)


def test_roformer_pretrain_launcher_openmpi(config, tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    run_dir = tmp_path / "run"
    result = roformer("pretrain", "--hostfile", str(hostfile), "--launcher", "openmpi",
                      "--launcher_args", "--allow-run-as-root --mca btl_tcp_if_include lo",
                      "--master_port", str(free_port()), "--config", str(config), "--run-dir", str(run_dir),
                      env=_mpi_env(), timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    runner_log = (run_dir / "logs" / "launcher.log").read_text()  # the console filters the runner's chatter
    assert "mpirun -n 2 -hostfile " + str(run_dir / "launch" / "hostfile") in runner_log
    _assert_trained_with_two_ranks(run_dir, output)
    assert "MASTER_PORT=" in (run_dir / ".deepspeed_env").read_text()

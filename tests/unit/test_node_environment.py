"""What each node of a multi-node launch receives from the launching (login) node, and what it computes
itself: the dry run over the shipped hostfile, the user's DeepSpeed env file, and the rank entry's
own environment (launcher/launch/env_forwarding.py, launcher/train/rank_entry.py)."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

from launcher.deepspeed_env import ops_cache
from launcher.cli import main as cli_main
from launcher.common.errors import UserError
from launcher.launch.env_forwarding import forwarded_environment, user_env_file_entries
from launcher.train.rank_entry import prepare_process_environment
from tests.support.helpers import REPO, write_yaml

HOSTFILE = REPO / "hostfile"
DEMO = REPO / "configs" / "demo_cpu.yaml"
VENV_BIN = str(Path(sys.executable).parent)


@pytest.fixture(scope="module")
def demo_config(tiny_data, tmp_path_factory) -> Path:
    config = yaml.safe_load(DEMO.read_text())
    config["data"]["data_dir"] = str(tiny_data)
    config["model"]["vocab_size"] = 900
    for section, key in (("schedule", "file"), ("deepspeed", "config")):
        config[section][key] = str((DEMO.parent / config[section][key]).resolve())
    return write_yaml(tmp_path_factory.mktemp("env") / "demo.yaml", config)


@pytest.fixture
def login_node(monkeypatch, tmp_path):
    """A login node's shell: pyenv shims and cargo on PATH, its own library path and op cache, a HOME
    without a DeepSpeed env file, plus what a cluster user sets for the GPU nodes."""
    for key in ("OMP_NUM_THREADS", "LD_LIBRARY_PATH", "CUDA_HOME", "DS_ENV_FILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("PATH", f"/home/u/.pyenv/shims:/home/u/.cargo/bin:{VENV_BIN}:/usr/bin:/bin")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/login/only/lib")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "/login/cpu-torch-ops")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")  # the CPU checks of this machine; a GPU user leaves it unset
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")
    monkeypatch.setenv("CUDA_HOME", "/usr/local/cuda-12.4")
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    return tmp_path / "home"


def dry_run(capsys, config: Path, run_dir: Path, *extra: str) -> str:
    code = cli_main(["pretrain", "--hostfile", str(HOSTFILE), "--config", str(config), "--run-dir", str(run_dir),
                     *extra, "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def environment_block(out: str) -> dict[str, str]:
    block = out.split("environment each node (node1, node2) receives from this machine")[1]
    block = block.split("computed on each node")[0]
    return dict(line.strip().split("=", 1) for line in block.splitlines()[1:] if line.startswith("  "))


def test_dry_run_shows_exactly_what_each_node_receives(login_node, demo_config, tmp_path, capsys):
    out = dry_run(capsys, demo_config, tmp_path / "r")
    received = environment_block(out)
    assert received["NCCL_SOCKET_IFNAME"] == "ib0" and received["CUDA_HOME"] == "/usr/local/cuda-12.4"
    assert received["DS_ACCELERATOR"] == "cpu" and received["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL"
    assert received["PYTHONPATH"].split(":")[0] == str(REPO)
    assert received["ROFORMER_RANKS_PER_NODE"] == "4"
    # Nothing of the login node's own set-up.
    for name in ("PATH", "TORCH_EXTENSIONS_DIR", "LD_LIBRARY_PATH", "OMP_NUM_THREADS", "HOME"):
        assert name not in received
    assert "pyenv" not in out and "/login/" not in out
    # The listing is what the pdsh command really exports on each node (DeepSpeed's own runner built it).
    for host in ("node1", "node2"):
        remote = re.search(rf"^  \[{host}\] (.*)$", out, re.M).group(1)
        exported = dict(re.findall(r"export (\w+)=([^;]*);", remote))
        assert set(exported) == set(received)
        assert exported["NCCL_SOCKET_IFNAME"] == "ib0"
    computed = out.split("computed on each node when its ranks start")[1]
    assert f"PATH: the node's own PATH, {VENV_BIN} appended when missing" in computed
    assert "TORCH_EXTENSIONS_DIR: ~/.cache/roformer-ds/torch_extensions/py<version>-torch<the node's torch version>" \
        in computed


def test_the_users_deepspeed_env_file_is_forwarded(login_node, demo_config, tmp_path, capsys):
    """DeepSpeed's documented way to forward more (here the GPU node's own library path) keeps working,
    although DS_ENV_FILE then names the run's file."""
    (login_node / ".deepspeed_env").write_text("# for the GPU nodes\nLD_LIBRARY_PATH=/opt/nccl/lib\n\nMY_SETTING=a=b\n")
    received = environment_block(dry_run(capsys, demo_config, tmp_path / "r"))
    assert received["LD_LIBRARY_PATH"] == "/opt/nccl/lib" and received["MY_SETTING"] == "a=b"


def test_a_bad_line_of_the_users_env_file_is_named(tmp_path):
    env_file = tmp_path / "custom_env"
    env_file.write_text("GOOD=1\nnot a setting\n")
    with pytest.raises(UserError, match=rf"^{re.escape(str(env_file))}:2: expected KEY=VALUE"):
        user_env_file_entries({"DS_ENV_FILE": str(env_file), "HOME": str(tmp_path)})


def test_local_ranks_still_get_this_machines_path_and_threads(login_node):
    env = forwarded_environment({"PATH": "/usr/bin:/bin", "TORCH_EXTENSIONS_DIR": "/x"}, ranks_per_node=2)
    assert env["PATH"] == f"/usr/bin:/bin:{VENV_BIN}" and int(env["OMP_NUM_THREADS"]) >= 1
    assert "TORCH_EXTENSIONS_DIR" not in env


def test_a_node_computes_its_own_environment_at_rank_start(tmp_path):
    """What a remote rank has when it starts: the forwarded variables on top of the node's own shell."""
    node_shell = {"PATH": "/usr/local/bin:/usr/bin", "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "c")}
    forwarded = forwarded_environment({"NCCL_SOCKET_IFNAME": "ib0", "TORCH_EXTENSIONS_DIR": "/login/ops",
                                       "HOME": str(tmp_path)}, ranks_per_node=4, local=False)
    environ = {**node_shell, **forwarded}
    prepare_process_environment(environ)
    assert environ["TORCH_EXTENSIONS_DIR"] == str(ops_cache.extensions_dir(node_shell))
    assert environ["TORCH_EXTENSIONS_DIR"].startswith(str(tmp_path / "c" / "roformer-ds" / "torch_extensions"))
    assert environ["PATH"] == f"/usr/local/bin:/usr/bin:{VENV_BIN}"
    cores = len(__import__("os").sched_getaffinity(0))
    assert environ["OMP_NUM_THREADS"] == str(max(1, cores // 4))
    # DeepSpeed's per-node launcher says how many ranks this node has: that wins over the plan's figure.
    environ = {**node_shell, **forwarded, "LOCAL_SIZE": "1"}
    prepare_process_environment(environ)
    assert environ["OMP_NUM_THREADS"] == str(cores)


def test_a_hopper_arch_list_is_rewritten_for_deepspeeds_jit_builder():
    """CUDA images for Hopper set TORCH_CUDA_ARCH_LIST='9.0a'; DeepSpeed's JIT builder (op_builder/builder.py,
    compute_capability_args) sorts the entries by int() of each part and failed on it on an H200."""
    environ = {"TORCH_CUDA_ARCH_LIST": "8.0 9.0a;9.0+PTX;10.0f", "PATH": "/usr/bin"}
    prepare_process_environment(environ)
    assert environ["TORCH_CUDA_ARCH_LIST"] == "8.0;9.0;9.0+PTX;10.0"
    for entry in environ["TORCH_CUDA_ARCH_LIST"].split(";"):
        tuple(int(part.split("+")[0]) for part in entry.split("."))  # DeepSpeed 0.19.8's sort key
    environ = {"PATH": "/usr/bin"}
    prepare_process_environment(environ)
    assert "TORCH_CUDA_ARCH_LIST" not in environ  # unset stays unset: DeepSpeed then asks the GPUs

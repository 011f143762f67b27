"""What `roformer pretrain` shows and logs (launcher/launch/console.py), and the per-environment op
cache (launcher/deepspeed_env/ops_cache.py). Fast: lines as DeepSpeed 0.19.8's runner and launcher print them,
no job is started (tests/multirank/test_launch_local.py runs the real one)."""
from __future__ import annotations

import io
import sys
from pathlib import Path

from launcher.deepspeed_env import ops_cache
from launcher.common.defaults import STATUS_MARKER
from launcher.launch.console import Console, hidden
from launcher.launch.env_forwarding import forwarded_environment

# Lines of real runs (DeepSpeed 0.19.8, CPU): local 2-rank ones and the runner of a multi-node one.
DS = "[2026-11-22 17:32:36,573] "
NOT_SHOWN = [
    DS + "[INFO] [runner.py:618:main] cmd = /work/main/.venv/bin/python -u -m deepspeed.launcher.launch "
         "--world_info=eyJsb2NhbGhvc3QiOiBbMCwgMV19 --master_addr=127.0.0.1 --master_port=29731 --module",
    DS + "[INFO] [launch.py:152:main] WORLD INFO DICT: {'localhost': [0, 1]}",
    DS + "[INFO] [launch.py:174:main] Setting CUDA_VISIBLE_DEVICES=0,1",
    DS + "[INFO] [launch.py:245:main] process 10021 spawned with command: ['/work/main/.venv/bin/python', '-u']",
    "DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully",
    DS + "[INFO] [launch.py:253:sigkill_handler] Killing subprocess 9808",
    DS + "[ERROR] [launch.py:259:sigkill_handler] ['/work/main/.venv/bin/python', '-u', '-m', "
         "'launcher.launch.rank_process'] exits with return code = 143",
    DS + "[INFO] [launch.py:285:main] Process 10022 exits successfully.",
]
SHOWN = [
    "stage 1/2 'short' after step 0 (steps 1-6): max_seq_len 32, global batch 8 = 4 x 1 x 2",
    "validation at step 5: loss 8.9784, MLM accuracy 0.0000",
    DS + "[ERROR] [launch.py:259:sigkill_handler] ['python', '-u'] exits with return code = 1",  # a failure
    "[roformer-rank-exit] rank=0 local_rank=0 node_rank=0 host=vm pid=9811 status=exit code 1",
    DS + "[WARNING] [engine.py:1:f] something DeepSpeed's engine says",
    DS + "[WARNING] [runner.py:214:fetch_hostfile] Unable to find hostfile, will proceed with training with local "
         "resources only.",  # only a multi-node run starts the runner, so the warning means something
    "Traceback (most recent call last):",
]


def test_what_does_not_apply_is_hidden_and_the_rest_shown():
    assert [line for line in NOT_SHOWN if hidden(line) is None] == []
    assert [line for line in SHOWN if hidden(line) is not None] == []


def test_the_log_keeps_every_line_and_the_console_what_applies(tmp_path):
    out, log = io.StringIO(), tmp_path / "logs" / "launcher.log"
    console = Console(out, log, status=False, hosts=["node1"])
    for line in NOT_SHOWN + SHOWN:
        console.job_line(f"node1: {line}\n")  # pdsh's prefix
    console.log_only("roformer pretrain: the runner's command")
    console.close()
    assert out.getvalue().splitlines() == [f"node1: {line}" for line in SHOWN]
    logged = log.read_text().splitlines()
    assert logged[0].startswith("=== ") and ": roformer " in logged[0]
    assert logged[1:] == [f"node1: {line}" for line in NOT_SHOWN + SHOWN] + ["roformer pretrain: the runner's command"]


def test_status_mode_redraws_one_line_with_every_other_line_above_it(tmp_path, capsys):
    terminal = io.StringIO()
    console = Console(terminal, tmp_path / "launcher.log", status=True)
    console.job_line(f"{STATUS_MARKER}step 1/10 (10%) | loss 9.0\n")
    console.job_line("validation at step 1: loss 8.9\n")
    console.job_line(f"{STATUS_MARKER}step 2/10 (20%) | loss 8.8\n")
    console.note("roformer pretrain: a note on stderr")
    console.close()
    clear = "\r\x1b[K"
    assert terminal.getvalue() == (f"{clear}step 1/10 (10%) | loss 9.0"
                                   f"{clear}validation at step 1: loss 8.9\nstep 1/10 (10%) | loss 9.0"
                                   f"{clear}step 2/10 (20%) | loss 8.8"
                                   f"{clear}step 2/10 (20%) | loss 8.8\n")
    assert capsys.readouterr().err == "roformer pretrain: a note on stderr\n"
    assert "step 1/10" not in (tmp_path / "launcher.log").read_text()  # status lines are not logged


def test_a_closed_stdout_stops_the_echo_not_the_log(tmp_path):
    closed = io.StringIO()
    closed.close()
    console = Console(closed, tmp_path / "launcher.log", status=False)
    console.job_line("validation at step 1: loss 8.9\n")  # no exception: the job keeps being monitored
    console.close()
    assert "validation at step 1" in (tmp_path / "launcher.log").read_text()


# --------------------------------------------------------------------------------------- op cache


def test_each_python_environment_gets_its_own_op_cache(tmp_path):
    root = ops_cache.cache_root({"XDG_CACHE_HOME": str(tmp_path)})
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    a = ops_cache.extensions_dir(env, "/work/a/.venv/bin/python")
    a3 = ops_cache.extensions_dir(env, "/work/a/.venv/bin/python3")
    b = ops_cache.extensions_dir(env, "/work/b/.venv/bin/python")
    assert a == a3 and a != b and a.parent == b.parent == root
    assert a.name.startswith(f"py{sys.version_info.major}{sys.version_info.minor}-torch")
    # The former shared default is keyed too; any other directory is the user's choice.
    assert ops_cache.extensions_dir({**env, "TORCH_EXTENSIONS_DIR": str(root)}, "/work/a/.venv/bin/python") == a
    assert ops_cache.extensions_dir({**env, "TORCH_EXTENSIONS_DIR": "/opt/ops"}, "/work/a/.venv/bin/python") == \
        Path("/opt/ops")
    # Never forwarded: each node's ranks compute their own (tests/unit/test_node_environment.py).
    forwarded = forwarded_environment({**env, "TORCH_EXTENSIONS_DIR": str(root)}, ranks_per_node=2,
                                      python="/work/b/.venv/bin/python")
    assert "TORCH_EXTENSIONS_DIR" not in forwarded

"""The plain DeepSpeed route on two nodes, as docs/multinode.md ("Plain DeepSpeed launcher") gives it:

    deepspeed --hostfile H --master_addr NODE1 --master_port P --module launcher.train.rank_entry \\
        --config C --run-dir R

with GLOO_SOCKET_IFNAME (and the rest the ranks need) in a `.deepspeed_env`. One run, one rank per node:
it trains past a stage boundary; SIGTERM to the `deepspeed` runner (which kills pdsh, closing every rank's
output pipe, then SIGTERMs each node's launcher over pdsh) must still end in the stop checkpoint at the
stop step, with rank 0's lines in RUN_DIR/logs/rank0.log; the same command resumes from it to the end;
`roformer export` exports the result. Nothing of the job is left on either node.

The runner's SIGTERM handler pkills `<its python> -u -m deepspeed.launcher.launch` on every node, and the
namespace nodes share this machine's processes: run from the venv's own path it would also kill the
launchers of the multi-rank tests running beside this one. So the runner runs from this test's own path
to the same venv (venv_alias).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import psutil

from launcher.deepspeed_env.ops_cache import extensions_dir
from tests.support.helpers import REPO, RANK_ENTRY, events, free_port, metrics_steps, newest_checkpoint, roformer
from tests.support.netns.jobs import (
    assert_nothing_left,
    cluster_env,
    cluster_hostfile,
    cluster_run_config,
    job_processes,
    wait_for_step,
)

WIDE_STEPS = 80  # the wide stage's steps take ~0.1 s: the stop lands 10-20 steps after the SIGTERM
TOTAL = 6 + 4 + WIDE_STEPS
STOP_AFTER_STEP = 12  # in the third stage, past the stage boundaries at 6 and 10
STOP_SECONDS = 90  # the runner's SIGTERM to the end of every rank (DeepSpeed's launcher allows 30 s)


def venv_alias(path: Path) -> Path:
    """`path` made a second path to this venv: the same interpreter, whose site directory loads the venv's
    own (so DeepSpeed's op sources keep their paths and its op cache is reused); returns its bin."""
    site = Path(sysconfig.get_paths()["purelib"])
    alias_site = path / site.relative_to(sys.prefix)
    alias_site.mkdir(parents=True)
    (alias_site / "venv.pth").write_text(f"import site; site.addsitedir({str(site)!r})\n")
    shutil.copy(Path(sys.prefix) / "pyvenv.cfg", path / "pyvenv.cfg")
    (path / "bin").mkdir()
    (path / "bin" / "python").symlink_to(os.path.realpath(sys.executable))
    runner = path / "bin" / "deepspeed"  # the venv's own script, with this path's interpreter
    runner.write_text(f"#!{path / 'bin' / 'python'}\nfrom deepspeed.launcher.runner import main\nmain()\n")
    runner.chmod(0o755)
    return path / "bin"


def deepspeed_env_file(path: Path, env: dict[str, str]) -> Path:
    """What the ranks need on the other node (docs/multinode.md): KEY=VALUE lines only, no comments."""
    needed = {"GLOO_SOCKET_IFNAME": "eth1", "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1",
              "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
              # Test only: the op cache this venv already built (the alias path would key a new one).
              "TORCH_EXTENSIONS_DIR": str(extensions_dir(env))}
    path.write_text("".join(f"{key}={value}\n" for key, value in needed.items()))
    return path


def kill_the_job(run_dir: Path) -> None:
    """After a failure: every process of the job (ranks, launchers, pdsh's ssh clients) on this machine."""
    for proc in psutil.process_iter(["cmdline"]):
        if f"--run-dir {run_dir}" in " ".join(proc.info["cmdline"] or []):
            proc.kill()


def wait_for_the_job_to_end(cluster, run_dir: Path, seconds: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        if not job_processes(run_dir) and not any(cluster.pids_in_nodes().values()):
            return time.monotonic() - started
        time.sleep(0.5)
    return time.monotonic() - started


def test_plain_deepspeed_runner_stops_with_a_checkpoint_and_resumes(cluster, tmp_path, data_dir):
    config = cluster_run_config(tmp_path, data_dir, wide_steps=WIDE_STEPS)
    run_dir, hostfile = tmp_path / "run", cluster_hostfile(tmp_path)
    env = cluster_env(cluster)
    bin_dir = venv_alias(tmp_path / "venv")
    env["DS_ENV_FILE"] = str(deepspeed_env_file(tmp_path / "deepspeed_env", env))  # absolute: this file alone
    cmd = [str(bin_dir / "deepspeed"), "--hostfile", str(hostfile), "--master_addr", cluster.address["node1"],
           "--master_port", str(free_port()), "--module", RANK_ENTRY, "--config", str(config),
           "--run-dir", str(run_dir)]

    first_log = tmp_path / "first.log"
    with open(first_log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for_step(proc, run_dir, STOP_AFTER_STEP, first_log)
        proc.send_signal(signal.SIGTERM)  # the runner: pdsh killed, then each node's launcher SIGTERMed
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            kill_the_job(run_dir)
    stop_seconds = wait_for_the_job_to_end(cluster, run_dir, STOP_SECONDS)
    output = first_log.read_text(errors="replace")
    rank0_log = run_dir / "logs" / "rank0.log"
    logged = rank0_log.read_text() if rank0_log.is_file() else "(no RUN_DIR/logs/rank0.log)"
    (stopped,) = events(run_dir, "stopped")
    point = newest_checkpoint(run_dir)
    assert point.sidecar.step == stopped["step"], output[-3000:] + logged
    assert STOP_AFTER_STEP < stopped["step"] < TOTAL
    assert "stop requested (SIGTERM): finishing step" in logged and \
        f"stopped at step {stopped['step']}; checkpoints in" in logged, output[-3000:] + logged
    assert "Traceback" not in logged
    assert_nothing_left(cluster, run_dir)

    second_log = tmp_path / "second.log"
    with open(second_log, "w") as out:
        try:
            rc = subprocess.run(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, timeout=300).returncode
        finally:
            kill_the_job(run_dir)
    assert rc == 0, second_log.read_text(errors="replace")[-4000:]
    assert [(e["tag"], e["world_size"]) for e in events(run_dir, "resume")] == [(point.tag, 2)]
    assert metrics_steps(run_dir) == list(range(1, TOTAL + 1))  # every step once
    assert newest_checkpoint(run_dir).sidecar.step == TOTAL
    assert_nothing_left(cluster, run_dir)

    export = roformer("export", str(run_dir), "--out", str(tmp_path / "export"), env=env)
    assert export.returncode == 0, export.stderr[-3000:]
    assert (tmp_path / "export" / "config.json").is_file()
    (save,) = [e for e in events(run_dir, "checkpoint") if e["step"] == stopped["step"]]
    print(f"\nplain deepspeed runner on two nodes: SIGTERM after step {STOP_AFTER_STEP}, stop checkpoint "
          f"{point.tag} (saved in {save['seconds']:.2f} s), every rank ended {stop_seconds:.1f} s after the "
          f"SIGTERM; resumed to step {TOTAL}")

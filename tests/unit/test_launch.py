"""`roformer pretrain` before anything starts: dry run, pre-flight errors, shell safety, process matching.

These run the real CLI in-process (no ranks are started); the multi-rank launches are in
test_launch_local.py, test_mpi.py and test_two_node.py.
"""
from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.support.helpers import (
    REPO,
    fake_tools,
    in_process_cli,
    run_config_dict,
    write_schedule,
    write_yaml,
)

DEMO = REPO / "configs" / "demo_cpu.yaml"
REFERENCE_HOSTFILE = REPO / "hostfile"


@pytest.fixture(scope="module")
def demo_on_tiny_data(tiny_data, tmp_path_factory) -> Path:
    """configs/demo_cpu.yaml on the session's tiny corpus (vocab 900), paths made absolute: `roformer
    pretrain` checks the data before anything starts, and runs/demo-data exists only after `make demo`."""
    config = yaml.safe_load(DEMO.read_text())
    config["data"]["data_dir"] = str(tiny_data)
    config["model"]["vocab_size"] = 900
    for section, key in (("schedule", "file"), ("deepspeed", "config")):
        config[section][key] = str((DEMO.parent / config[section][key]).resolve())
    return write_yaml(tmp_path_factory.mktemp("demo") / DEMO.name, config)


@pytest.fixture(autouse=True)
def _demo_config(demo_on_tiny_data, monkeypatch):
    """DEMO is that copy in every test here."""
    monkeypatch.setattr(sys.modules[__name__], "DEMO", demo_on_tiny_data)


@pytest.fixture
def cli(monkeypatch, capsys):
    """Run `roformer ARGS` in this process; returns (exit code, stdout, stderr)."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    return in_process_cli(monkeypatch, capsys)


def world_info_of(command: str) -> dict:
    encoded = re.search(r"--world_info=(\S+)", command).group(1)
    return json.loads(base64.urlsafe_b64decode(encoded))


def command_lines(out: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in re.finditer(r"^  \[([^\]]+)\] (.*)$", out, re.M)}


def stage_rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if re.match(r"^\s*\d+\s+\S+\s+\d+\s+\d+\s+\d+\s+\d+", line)]


def test_dry_run_local_shows_command_ranks_and_batch_arithmetic(cli, tmp_path):
    run_dir = tmp_path / "never-created"
    code, out, err = cli("pretrain", "--num_gpus", "2", "--config", str(DEMO), "--run-dir", str(run_dir), "--dry-run")
    assert code == 0, err
    assert "world size: 2" in out
    rows = stage_rows(out)
    assert len(rows) == 3  # demo schedule: three stages
    for _index, _name, _max_len, global_batch, micro, accum, *_ in rows:
        assert int(global_batch) == int(micro) * int(accum) * 2
    commands = command_lines(out)
    launch = commands["this machine"]
    assert f"{sys.executable} -u -m launcher.launch.deepspeed_processes launch --world_info=" in launch
    assert world_info_of(launch) == {"localhost": [0, 1]}
    assert "DS_ACCELERATOR=cpu" in launch
    expected_rank = f"-m launcher.launch.rank_process launcher.train.rank_entry --config {DEMO} --run-dir {run_dir}"
    assert expected_rank in commands["localhost rank 0"] and expected_rank in commands["localhost rank 1"]
    assert "RANK=1 LOCAL_RANK=1" in commands["localhost rank 1"]
    assert not run_dir.exists()  # a dry run writes nothing


def test_pretrain_parses_the_run_config_once(cli, tmp_path, monkeypatch):
    """The launch plan parses the run config and holds it: the branch target, the checks, the dry run's
    estimate and the restart policy read that one parse (each rank parses the file again in its own process)."""
    from launcher.config import run_config

    parses = []
    parse = run_config.run_config_from_dict

    def counted(*args, **kwargs):
        parses.append(kwargs.get("source", args[1] if len(args) > 1 else None))
        return parse(*args, **kwargs)

    monkeypatch.setattr(run_config, "run_config_from_dict", counted)
    code, _, err = cli("pretrain", "--num_gpus", "2", "--config", str(DEMO), "--run-dir", str(tmp_path / "run"),
                       "--dry-run")
    assert code == 0, err
    assert parses == [str(DEMO.resolve())]


def test_dry_run_reference_hostfile_prints_each_nodes_pdsh_command(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("ROFORMER_MARK", "forwarded")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")
    monkeypatch.setenv("UNRELATED_SECRET", "not-forwarded")
    monkeypatch.setenv("HF_TOKEN", "hf_credential_value")  # HF_ prefix, but a credential: not forwarded
    code, out, err = cli("pretrain", "--hostfile", str(REFERENCE_HOSTFILE), "--config", str(DEMO),
                         "--run-dir", str(tmp_path / "r"), "--set", "optimizer.lr=5e-4", "--dry-run")
    assert code == 0, err
    assert "world size: 8" in out
    for row in stage_rows(out):
        assert int(row[3]) == int(row[4]) * int(row[5]) * 8
    commands = command_lines(out)
    assert commands["this machine"].startswith("pdsh -S -f 1024 -w node1,node2")
    for node_rank, host in enumerate(["node1", "node2"]):
        remote = commands[host]
        assert f"--node_rank={node_rank}" in remote and "%n" not in remote
        assert f"cd {REPO};" in remote
        assert world_info_of(remote) == {"node1": [0, 1, 2, 3], "node2": [0, 1, 2, 3]}
        for export in ("export DS_ACCELERATOR=cpu;", "export ROFORMER_MARK=forwarded;",
                       "export NCCL_SOCKET_IFNAME=ib0;"):
            assert export in remote
        # Not this machine's PATH: each node appends the venv's bin to its own (tests/unit/test_node_environment.py).
        assert "export PATH=" not in remote
        assert "UNRELATED_SECRET" not in remote
        assert remote.endswith(f"--config {DEMO} --run-dir {tmp_path / 'r'} --set optimizer.lr=5e-4")
    assert commands["node2 rank 7"].startswith("RANK=7 LOCAL_RANK=3 ")
    assert "hf_credential_value" not in out


@pytest.mark.parametrize("flags, world_size, info", [
    (["--include", "node2:0,1"], 2, {"node2": [0, 1]}),
    (["--exclude", "node1"], 4, {"node2": [0, 1, 2, 3]}),
    (["--num_nodes", "1", "--num_gpus", "2"], 2, {"node1": [0, 1]}),
])
def test_dry_run_host_filters(cli, tmp_path, flags, world_size, info):
    code, out, err = cli("pretrain", "--hostfile", str(REFERENCE_HOSTFILE), *flags, "--config", str(DEMO),
                         "--run-dir", str(tmp_path / "r"), "--dry-run")
    assert code == 0, err
    assert f"world size: {world_size}" in out
    host = next(iter(info))
    assert world_info_of(command_lines(out)[host]) == info


def test_world_size_that_breaks_a_stage_is_refused_naming_it(cli, tmp_path, tiny_data):
    schedule = write_schedule(tmp_path / "sched.yaml", [
        {"name": "fits", "max_seq_len": 32, "global_batch_size": 16, "steps": 2},
        {"name": "twelve", "max_seq_len": 32, "global_batch_size": 12, "steps": 2},
    ])
    config = write_yaml(tmp_path / "run.yaml", run_config_dict(data_dir=tiny_data, schedule_file=schedule))
    code, out, _ = cli("pretrain", "--num_gpus", "4", "--config", str(config), "--run-dir", str(tmp_path / "r"),
                       "--dry-run")
    assert code == 0  # 12 and 16 are both divisible by 4
    code, _, err = cli("pretrain", "--hostfile", str(REFERENCE_HOSTFILE), "--config", str(config),
                       "--run-dir", str(tmp_path / "r"), "--dry-run")
    assert code == 2
    assert "world size 8" in err and "node1 x4, node2 x4" in err and "twelve" in err


BAD_HOSTFILES = {
    "semicolon": ("node1 slots=1\nnode2;touch {marker} slots=1\n", ":2: 'node2;touch'"),
    "command substitution": ("$(touch {marker}) slots=1\n", ":1: '$(touch'"),
    "backticks": ("`touch {marker}` slots=1\n", ":1: '`touch'"),
    "option injection": ("-oProxyCommand=touch{marker} slots=1\n", ":1: '-oProxyCommand=touch"),
    "duplicate": ("node1 slots=1\nnode1 slots=1\n", ":2: duplicate host 'node1'"),
    "zero slots": ("node1 slots=0\n", ":1: slots must be >= 1"),
    "unknown key": ("node1 slots=1 gpus=2\n", ":1: unknown key 'gpus'"),
}


@pytest.mark.parametrize("case", sorted(BAD_HOSTFILES))
def test_bad_hostfile_refused_before_any_process_or_shell(cli, tmp_path, monkeypatch, case):
    marker = tmp_path / "pwned"
    text, message = BAD_HOSTFILES[case]
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(text.format(marker=marker))
    calls = tmp_path / "calls.log"
    for key, value in fake_tools(tmp_path / "bin", calls).items():
        monkeypatch.setenv(key, value)
    run_dir = tmp_path / "run"
    code, _, err = cli("pretrain", "--hostfile", str(hostfile), "--config", str(DEMO), "--run-dir", str(run_dir))
    assert code == 2
    assert f"{hostfile}{message}" in err
    assert not calls.exists(), calls.read_text()  # no ssh, pdsh or mpirun was started
    assert not marker.exists() and not run_dir.exists()


@pytest.mark.parametrize("flags, message", [
    (["--include", "node3"], "--include: host 'node3' is not in"),
    (["--exclude", "node2:7"], "--exclude: host 'node2' has slots 0..3"),
    (["--include", "node1", "--num_gpus", "1"], "cannot be combined"),
    (["--launcher", "openmpi", "--num_gpus", "1"], "uses every slot of the hostfile"),
    (["--master_port", "70000"], "--master_port 70000"),
    (["--master_addr", "10.0.0.1 x"], "--master_addr: '10.0.0.1 x' contains a space"),
])
def test_bad_launch_flags_named(cli, tmp_path, flags, message):
    code, _, err = cli("pretrain", "--hostfile", str(REFERENCE_HOSTFILE), *flags, "--config", str(DEMO),
                       "--run-dir", str(tmp_path / "r"), "--dry-run")
    assert code == 2 and message in err


def test_launcher_without_hostfile_is_refused(cli, tmp_path):
    code, _, err = cli("pretrain", "--launcher", "openmpi", "--config", str(DEMO), "--run-dir", str(tmp_path))
    assert code == 2 and "needs a --hostfile" in err and "localhost slots=N" in err


def test_shell_metacharacters_never_reach_pdsh(cli, tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    calls = tmp_path / "calls.log"
    for key, value in fake_tools(tmp_path / "bin", calls).items():
        monkeypatch.setenv(key, value)
    common = ["pretrain", "--hostfile", str(REFERENCE_HOSTFILE), "--config", str(DEMO)]
    code, _, err = cli(*common, "--run-dir", str(tmp_path / "r"), "--set", f"data.data_dir=/x;touch {marker}")
    assert code == 2 and "--set data.data_dir=/x;touch" in err and "remote shell" in err
    code, _, err = cli(*common, "--run-dir", str(tmp_path / "r$(touch x)"))
    assert code == 2 and "--run-dir" in err
    monkeypatch.setenv("ROFORMER_EVIL", f"$(touch {marker})")
    code, _, err = cli(*common, "--run-dir", str(tmp_path / "r"))
    assert code == 2 and "environment variable ROFORMER_EVIL" in err
    assert not calls.exists() and not marker.exists()


def test_unreachable_hosts_named_and_nothing_started(cli, tmp_path, monkeypatch):
    """Real ssh (through a wrapper adding -F CONFIG) to ports where nothing listens."""
    config = tmp_path / "ssh_config"
    config.write_text("Host deadhost alsodead\n  HostName 127.0.0.1\n  Port 1\n  BatchMode yes\n"
                      "  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  ConnectTimeout 5\n")
    bin_dir = tmp_path / "bin"
    calls = tmp_path / "calls.log"
    env = fake_tools(bin_dir, calls, names=("pdsh", "mpirun"))
    (bin_dir / "ssh").write_text(f'#!/bin/dash\nexec /usr/bin/ssh -F {config} "$@"\n')
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", env["PATH"])
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# two hosts nobody answers for\ndeadhost slots=1\nalsodead slots=1\n")
    code, _, err = cli("pretrain", "--hostfile", str(hostfile), "--config", str(DEMO), "--run-dir",
                       str(tmp_path / "run"))
    assert code == 2
    assert f"deadhost ({hostfile}:2)" in err and f"alsodead ({hostfile}:3)" in err and "not reachable" in err
    assert not calls.exists()  # pdsh never started
    assert not (tmp_path / "run" / ".deepspeed_env").exists()


def test_run_dir_that_cannot_be_created_or_is_a_file(cli, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    code, _, err = cli("pretrain", "--num_gpus", "2", "--config", str(DEMO), "--run-dir", str(blocker / "run"))
    assert code == 2 and f"--run-dir {blocker / 'run'}: cannot create it" in err
    code, _, err = cli("pretrain", "--num_gpus", "2", "--config", str(DEMO), "--run-dir", str(blocker))
    assert code == 2 and "exists and is not a directory" in err


def test_read_only_run_dir_refused(tmp_path):
    """A read-only mount (root ignores permission bits), in a private mount namespace."""
    run_dir = tmp_path / "ro"
    run_dir.mkdir()
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot create a mount namespace here: {probe.stderr.decode().strip()}")
    script = (f"mount -t tmpfs -o ro tmpfs {run_dir} && exec {sys.executable} -m launcher pretrain --num_gpus 2 "
              f"--config {DEMO} --run-dir {run_dir}")
    result = subprocess.run(["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script],
                            cwd=REPO, capture_output=True, text=True, env=dict(os.environ, DS_ACCELERATOR="cpu"),
                            timeout=120)
    assert result.returncode == 2, result.stderr
    assert f"--run-dir {run_dir}: not writable" in result.stderr


def _sleeper(*argv: str) -> subprocess.Popen:
    """A process whose command line is `python -c <sleep> ARGV...` (what pkill -f sees)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *argv])


def test_stop_patterns_match_only_this_jobs_processes(tmp_path):
    """pgrep (POSIX ERE, as pkill uses) against real processes with launcher-like command lines."""
    from argparse import Namespace

    from launcher.launch.launch_plan import DEEPSPEED_PROCESSES, build_plan
    from launcher.launch.supervise import job_pattern, rank_pattern

    run_dir = tmp_path / "run"
    args = Namespace(hostfile=str(REFERENCE_HOSTFILE), include="", exclude="", num_nodes=-1, num_gpus=-1,
                     master_addr="", master_port=29500, launcher="pdsh", launcher_args="", force_multi=False,
                     bind_cores_to_rank=False, bind_core_list=None, config=str(DEMO), run_dir=str(run_dir),
                     overrides=["optimizer.lr=1e-3"], entry_module="launcher.train.rank_entry")
    plan = build_plan(args)
    tail = plan.rank_args
    procs = {
        "node launcher": _sleeper("-u", "-m", "deepspeed.launcher.launch", "--world_info=e30=", "--module",
                                  "launcher.launch.rank_process", "launcher.train.rank_entry", *tail),
        "guard": _sleeper("-u", "-m", "launcher.launch.rank_process", "launcher.train.rank_entry", *tail),
        "rank": _sleeper("-u", "-m", "launcher.train.rank_entry", *tail),
        "runner": _sleeper("-u", "-m", DEEPSPEED_PROCESSES, "runner", "--hostfile", "h", "--module",
                           "launcher.launch.rank_process", "launcher.train.rank_entry", *tail),
        "other run": _sleeper("-u", "-m", "launcher.train.rank_entry", "--config", str(DEMO), "--run-dir",
                              f"{run_dir}-other"),
        "wrapper": _sleeper("-m", "launcher", "pretrain", "--config", str(DEMO), "--run-dir", str(run_dir)),
    }
    try:
        time.sleep(0.3)
        name_of = {p.pid: name for name, p in procs.items()}

        def pgrep(pattern: str) -> set[str]:
            out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
            return {name_of[int(pid)] for pid in out.split() if int(pid) in name_of}

        assert pgrep(job_pattern(plan)) == {"node launcher", "guard", "rank"}
        assert pgrep(rank_pattern(plan)) == {"rank"}
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def test_a_remote_stop_signals_each_rank_once_and_the_ranks_started_since(tmp_path):
    """A stop asked while a pdsh job starts: the command `roformer pretrain` runs over ssh on each poll SIGTERMs
    the ranks it has not signalled yet (a second SIGTERM to a rank would mean "stop now") and names them."""
    from launcher.launch.supervise import rank_pattern, remote_stop_command

    plan = _plan("pdsh", tmp_path)

    def run_remote(seen: set[int]) -> set[int]:
        out = subprocess.run(["bash", "-c", remote_stop_command(rank_pattern(plan), seen)], capture_output=True,
                             text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        return {int(pid) for pid in out.stdout.split()}

    guard = _sleeper("-u", "-m", "launcher.launch.rank_process", "launcher.train.rank_entry", *plan.rank_args)
    # A rank busy with its stop: it records the SIGTERM and goes on (here: ignores it).
    first = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                              "signal.SIG_IGN); time.sleep(120)", "-u", "-m", "launcher.train.rank_entry",
                              *plan.rank_args])
    later = None
    try:
        time.sleep(0.3)
        assert run_remote(set()) == {first.pid}
        later = _sleeper("-u", "-m", "launcher.train.rank_entry", *plan.rank_args)
        time.sleep(0.3)
        assert run_remote({first.pid}) == {later.pid}  # the rank started since; the first not again
        assert later.wait(timeout=20) == -signal.SIGTERM
        assert first.poll() is None and guard.poll() is None
    finally:
        for proc in (guard, first, later):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_stop_on_a_hostfiles_nodes_reaches_each_rank_once_as_it_appears(tmp_path, monkeypatch):
    """StopForwarder over ssh (here a stand-in that runs the command on this machine as node1, and fails as
    ssh does for node2): the ranks there now, then only the one started since, node2 asked once."""
    from launcher.launch.supervise import StopForwarder

    plan = _plan("pdsh", tmp_path)
    bin_dir, calls = tmp_path / "bin", tmp_path / "ssh.calls"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(f"#!/bin/bash\nhost=${{@: -2:1}}\necho $host >> {calls}\n"
                                 "[ \"$host\" = node2 ] && exit 255\nexec bash -c \"${@: -1}\"\n")
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    busy = [subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                              "signal.SIG_IGN); time.sleep(120)", "-u", "-m", "launcher.train.rank_entry",
                              *plan.rank_args]) for _ in range(2)]  # ranks that record the stop and go on
    later = None
    try:
        time.sleep(0.3)
        forwarder = StopForwarder(plan, runner=busy[0])
        forwarder.forward()
        assert forwarder.signalled == {"node1": {p.pid for p in busy}, "node2": set()}
        later = _sleeper("-u", "-m", "launcher.train.rank_entry", *plan.rank_args)
        time.sleep(0.3)
        forwarder.forward()  # within REMOTE_STOP_POLL_SECONDS: nobody asked
        forwarder.next_remote_look = 0.0
        forwarder.forward()
        assert later.wait(timeout=20) == -signal.SIGTERM
        assert forwarder.signalled["node1"] == {p.pid for p in busy} | {later.pid}
        assert calls.read_text().split() == ["node1", "node2", "node1"]  # node2 unreachable: asked once
        assert all(p.poll() is None for p in busy)
    finally:
        for proc in (*busy, later):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def test_local_stop_matches_ranks_of_a_run_dir_with_any_character(tmp_path):
    """The local Ctrl-C path matches real command lines in Python; '^' and '\\' in --run-dir once
    made its regex fail to compile (leaving the job running in its own session)."""
    from argparse import Namespace

    import psutil

    from launcher.launch.launch_plan import build_plan
    from launcher.launch.supervise import local_rank_regex

    run_dir = tmp_path / "r^un\\1"
    plan = build_plan(Namespace(
        hostfile=None, include="", exclude="", num_nodes=-1, num_gpus=2, master_addr="", master_port=29500,
        launcher="pdsh", launcher_args="", force_multi=False, bind_cores_to_rank=False, bind_core_list=None,
        config=str(DEMO), run_dir=str(run_dir), overrides=[], entry_module="launcher.train.rank_entry"))
    procs = {
        "rank": _sleeper("-u", "-m", "launcher.train.rank_entry", *plan.rank_args),
        "guard": _sleeper("-u", "-m", "launcher.launch.rank_process", "launcher.train.rank_entry", *plan.rank_args),
        "other run": _sleeper("-u", "-m", "launcher.train.rank_entry", "--config", str(DEMO), "--run-dir",
                              f"{plan.run_dir}x"),
    }
    try:
        regex = local_rank_regex(plan)
        matched = {name for name, p in procs.items() if regex.search(" ".join(psutil.Process(p.pid).cmdline()))}
        assert matched == {"rank"}
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def _guard(*module_args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "launcher.launch.rank_process", *module_args], cwd=REPO,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, **kwargs)


def _child_of(pid: int, timeout: float = 20) -> int:
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = psutil.Process(pid).children()
        if children:
            return children[0].pid
        time.sleep(0.05)
    raise AssertionError(f"process {pid} started no child")


def _gone(pid: int, timeout: float = 20) -> bool:
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.05)
    return False


def test_rank_guard_names_a_rank_killed_by_sigkill():
    guard = _guard("http.server", "0", "--bind", "127.0.0.1", env=dict(os.environ, RANK="5", LOCAL_RANK="1"))
    rank = _child_of(guard.pid)
    os.kill(rank, signal.SIGKILL)
    _, err = guard.communicate(timeout=30)
    assert guard.returncode == 128 + signal.SIGKILL
    assert re.search(rf"\[roformer-rank-exit\] rank=5 local_rank=1 .* pid={rank} status=killed by SIGKILL", err)


def test_rank_guard_quiet_on_requested_stop_and_stops_rank_when_orphaned(tmp_path):
    # Stop requested (the rank gets the signal too, as with every stop path): no failure line.
    guard = _guard("http.server", "0", "--bind", "127.0.0.1")
    rank = _child_of(guard.pid)
    guard.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert not _gone(rank, timeout=0.5)  # the guard did not add a second signal
    os.kill(rank, signal.SIGTERM)
    _, err = guard.communicate(timeout=30)
    assert guard.returncode == 128 + signal.SIGTERM and "roformer-rank-exit" not in err

    # Its launcher dies (SIGKILL, no cleanup): the guard must not leave the rank behind.
    pid_file = tmp_path / "guard.pid"
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        f"g = subprocess.Popen([sys.executable, '-m', 'launcher.launch.rank_process', 'http.server', '0', '--bind', '127.0.0.1'],"
        f" cwd={str(REPO)!r})\n"
        f"open({str(pid_file)!r}, 'w').write(str(g.pid))\n"
        "time.sleep(120)\n")])
    deadline = time.monotonic() + 20
    while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    guard_pid = int(pid_file.read_text())
    rank = _child_of(guard_pid)
    parent.kill()
    parent.wait()
    assert _gone(guard_pid) and _gone(rank)


def test_guard_treats_the_trainers_orderly_stop_as_no_failure(tmp_path):
    """The rank entry's exit code after a checkpointed stop (launcher.common.defaults) is not reported as a death."""
    from launcher.common.defaults import ORDERLY_STOP_EXIT_CODE

    script = tmp_path / "orderly_stop.py"
    script.write_text(f"import sys\nsys.exit({ORDERLY_STOP_EXIT_CODE})\n")
    proc = subprocess.run([sys.executable, "-m", "launcher.launch.rank_process", "orderly_stop"], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": f"{REPO}:{tmp_path}"}, capture_output=True, text=True)
    assert proc.returncode == ORDERLY_STOP_EXIT_CODE
    assert "[roformer-rank-exit]" not in proc.stderr


def _plan(launcher: str = "pdsh", tmp_path: Path = Path("/tmp/unused")):
    from argparse import Namespace

    from launcher.launch.launch_plan import build_plan

    return build_plan(Namespace(
        hostfile=str(REFERENCE_HOSTFILE), include="", exclude="", num_nodes=-1, num_gpus=-1, master_addr="",
        master_port=29500, launcher=launcher, launcher_args="", force_multi=False, bind_cores_to_rank=False,
        bind_core_list=None, config=str(DEMO), run_dir=str(tmp_path / "run"), overrides=[],
        entry_module="launcher.train.rank_entry"))


def test_output_monitor_blames_the_first_rank_that_died():
    from launcher.launch.supervise import OutputMonitor, failure_report

    monitor = OutputMonitor(_plan("pdsh"))
    for line in [
        "node1: rank 0 step 12 loss 6.1\n",
        "node2: [roformer-rank-exit] rank=6 local_rank=2 node_rank=1 host=gpu2 pid=77 status=killed by SIGKILL\n",
        "pdsh@gpu1: node2: ssh exited with exit code 137\n",
        "node1: [roformer-rank-exit] rank=1 local_rank=1 node_rank=0 host=gpu1 pid=12 status=exit code 1\n",
    ]:
        monitor.feed(line)
        time.sleep(0.01)
    first = monitor.first()
    assert (first.rank, first.host, first.status) == (6, "node2", "killed by SIGKILL")
    report = failure_report(monitor, 137, stopped_after_failure=False)
    assert report.startswith("rank 6 (local rank 2) on node node2: killed by SIGKILL; the job was stopped")
    assert "Afterwards: rank 1 (local rank 1) on node node1: exit code 1" in report


def test_a_rank_that_only_lost_its_peer_is_not_the_cause_even_when_its_exit_is_seen_first():
    from launcher.launch.supervise import OutputMonitor
    from launcher.train.peer_errors import rank_stop_line

    # rank 1 was SIGKILLed; rank 0's collective failed at once and its exit can reach us before the
    # killed rank's wrapper reports (a loaded machine): the restart loop compares causes across launches.
    line, code = rank_stop_line(RuntimeError("[pair.cc:534] Connection closed by peer [127.0.0.1]:123"), "0")
    monitor = OutputMonitor(_plan("pdsh"))
    for text in [f"node1: {line}\n",
                 f"node1: [roformer-rank-exit] rank=0 local_rank=0 node_rank=0 host=gpu1 pid=12 status=exit code {code}\n",
                 "node1: [roformer-rank-exit] rank=1 local_rank=1 node_rank=0 host=gpu1 pid=13 status=killed by SIGKILL\n"]:
        monitor.feed(text)
        time.sleep(0.01)
    assert (monitor.first().rank, monitor.first().status) == (1, "killed by SIGKILL")

    alone = OutputMonitor(_plan("pdsh"))  # nobody else failed: the rank that lost its peer is all we know
    alone.feed(f"node1: {line}\n")
    alone.feed("node1: [roformer-rank-exit] rank=0 local_rank=0 node_rank=0 host=gpu1 pid=12 status=exit code 1\n")
    assert alone.first().rank == 0


def test_the_last_line_names_the_first_error_a_rank_gave_not_only_its_exit_code():
    from launcher.launch.restart_loop import fault_of
    from launcher.launch.supervise import JobOutcome, OutputMonitor, failure_report

    monitor = OutputMonitor(_plan("pdsh"))
    cause = ("checkpoint global_step40 could not be written to /runs/r/checkpoints (rank 1: the filesystem is "
             "full (12 kB free)): free space, then run the same command to resume")
    for line in [
        "node1: rank 0 step 40 loss 5.2\n",
        f"node2: pretrain (rank 6): error: {cause}\n",  # the first rank that said why
        "node1: pretrain (rank 0): error: a later line of another rank\n",
        "node2: [roformer-rank-exit] rank=6 local_rank=2 node_rank=1 host=gpu2 pid=77 status=exit code 2\n",
        "node1: [roformer-rank-exit] rank=0 local_rank=0 node_rank=0 host=gpu1 pid=12 status=exit code 2\n",
    ]:
        monitor.feed(line)
        time.sleep(0.01)
    assert (monitor.first_error.rank, monitor.first_error.message) == (6, cause)
    report = failure_report(monitor, 2, stopped_after_failure=False)
    assert report == (f"rank 6: {cause} [rank 6 (local rank 2) on node node2: exit code 2; the job was stopped on all "
                      "nodes. Afterwards: rank 0 (local rank 0) on node node1: exit code 2]")
    fault = fault_of(JobOutcome(2, monitor.first(), None, time.monotonic(), [], monitor.first_error), 40)
    assert fault.status == "exit code 2" and fault.error == f"rank 6: {cause}" and cause in fault.cause

    quiet = OutputMonitor(_plan("pdsh"))  # no rank said anything (a SIGKILL): the exit status alone, as before
    quiet.feed("node2: [roformer-rank-exit] rank=6 local_rank=2 node_rank=1 host=gpu2 pid=77 status=killed by SIGKILL\n")
    assert failure_report(quiet, 137, False) == "rank 6 (local rank 2) on node node2: killed by SIGKILL; the job was " \
                                                "stopped on all nodes"


def test_output_monitor_maps_mpi_ranks_to_hosts_and_ignores_orderly_stops():
    from launcher.launch.supervise import OutputMonitor

    monitor = OutputMonitor(_plan("openmpi"))  # mpirun adds no host prefix: rank -> host from the hostfile order
    monitor.feed("[...] exits with return code = 143\n")  # a checkpointed stop is not a failure
    assert monitor.first() is None
    monitor.feed("[roformer-rank-exit] rank=5 local_rank=1 node_rank=? host=x pid=3 status=exit code 2\n")
    assert (monitor.first().rank, monitor.first().host) == (5, "node2")


def test_a_rank_killed_before_its_wrapper_is_stopped_is_still_reported(tmp_path):
    """DeepSpeed's launcher SIGTERMs every wrapper as soon as one rank's failure reaches it: a wrapper whose own rank
    had been killed just before must still report that kill (the job names it as the cause), not take it as
    the stop's doing (CI: the restart named the rank that had only lost its peer)."""
    import psutil

    (tmp_path / "killed_rank.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    guard = subprocess.Popen([sys.executable, "-m", "launcher.launch.rank_process", "killed_rank"], cwd=tmp_path,
                             env={**os.environ, "PYTHONPATH": f"{REPO}:{tmp_path}", "RANK": "1", "LOCAL_RANK": "1"},
                             stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the rank is dead (a zombie until its wrapper's next look): stop the wrapper
        children = psutil.Process(guard.pid).children() if guard.poll() is None else []
        if guard.poll() is not None or any(c.status() == psutil.STATUS_ZOMBIE for c in children):
            break
        time.sleep(0.005)
    try:
        guard.send_signal(signal.SIGTERM)
    except ProcessLookupError:
        pass  # it had already looked and reported
    out, err = guard.communicate(timeout=30)
    assert "[roformer-rank-exit] rank=1 local_rank=1" in out + err and "status=killed by SIGKILL" in out + err, \
        (out, err)
    assert guard.returncode == 128 + signal.SIGKILL

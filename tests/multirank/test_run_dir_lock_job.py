"""One job per run directory with real jobs (issue 20, section 3): a running `roformer pretrain` holds
RUN_DIR's lock; a second `roformer pretrain` on it, and a rank 0 started without the launcher, are
refused in one line naming the holder, exit 2, writing nothing; `export` and `report` work on the
running run; a stale lock left by a dead process is taken over, saying so; the lock goes with the job.

The job is held still (SIGSTOP) from its first checkpoint until the test has done all of that, so that it
trains no further meanwhile (no CPU spent on it) and any write of the second start would show. `export` and
`report` run in this process (the commands themselves: tests/unit/test_export_length.py, tests/unit/test_report.py),
the lone rank 0 is forked warm (tests/support/fork_server.py)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from launcher.run_dir.layout import RunDir
from launcher.run_dir.lock import LOCK_ID_ENV, lock_path, read_holder
from tests.support.helpers import REPO, free_port, roformer, roformer_env, start_roformer, start_run, tiny_run_config

# A schedule far longer than the test: the job runs until the test stops it (Ctrl-C), whatever the speed.
ENDLESS = [{"name": "long", "max_seq_len": 16, "global_batch_size": 4, "steps": 100000}]
# Held still for a minute or more on a loaded machine: the rank guard's hang bound must not take that for a hang.
PATIENT_WATCHDOG = {"min_step_seconds": 3600.0, "phase_seconds": 3600.0}


def tree_state(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and directory under root with (size, mtime_ns): any write shows."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in [root, *root.rglob("*")]}


def job_processes(proc: subprocess.Popen) -> list[psutil.Process]:
    """The job's launcher and everything under it (DeepSpeed's runner is in a session of its own)."""
    top = psutil.Process(proc.pid)
    return [top, *top.children(recursive=True)]


def test_a_running_job_keeps_its_run_directory_to_itself(tiny_data, tmp_path):
    from launcher.cli import main as cli_main

    config = tiny_run_config(tmp_path / "config", tiny_data, stages=ENDLESS, checkpoint={"every_steps": 2},
                             watchdog=PATIENT_WATCHDOG)
    run_dir, log = tmp_path / "run", tmp_path / "first.out"
    # A lock left by a job that died (its pid is gone): the first job takes it over, saying so.
    dead = subprocess.Popen([sys.executable, "-c", "import sys, os; from launcher.run_dir.lock import acquire; "
                             "acquire(sys.argv[1]); os._exit(0)", str(run_dir)], cwd=REPO, env=roformer_env())
    assert dead.wait() == 0 and read_holder(run_dir).pid == dead.pid
    # One torch thread for the rank (forwarded): a second one spins waiting for a core when the CI's lanes share two.
    first = start_roformer("pretrain", "--num_gpus", "1", "--master_port", str(free_port()), "--config", str(config),
                           "--run-dir", str(run_dir), env=roformer_env(OMP_NUM_THREADS="1"), log=log)
    try:
        deadline = time.monotonic() + 300
        while not RunDir(run_dir).latest.exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert first.poll() is None and RunDir(run_dir).latest.exists(), log.read_text()[-3000:]
        # The whole first job held still from here on: it trains no further while the test works, and any write
        # of the second start would show.
        frozen = job_processes(first)
        for process in frozen:
            process.send_signal(signal.SIGSTOP)
        try:
            holder = read_holder(run_dir)
            assert (holder.pid, holder.command) == (first.pid, "roformer pretrain")
            assert (f"roformer pretrain: note: --run-dir {run_dir}: took over the lock of roformer pretrain "
                    f"(pid {dead.pid} on ") in log.read_text()
            assert log.read_text().count("took over the lock") == 1  # rank 0 joined its launcher's lock silently

            # Read-only commands on the running run (alive, its lock held).
            assert cli_main(["export", str(run_dir), "--out", str(tmp_path / "export")]) == 0
            assert json.loads((tmp_path / "export" / "export_info.json").read_text())["step"] >= 2
            assert cli_main(["report", str(run_dir), "--out", str(tmp_path / "report")]) == 0
            assert (tmp_path / "report" / "report.md").is_file()

            before = tree_state(run_dir)
            second = roformer("pretrain", "--num_gpus", "1", "--master_port", str(free_port()), "--config",
                              str(config), "--run-dir", str(run_dir), timeout=120)
            after = tree_state(run_dir)
            # A rank 0 of a plain mpirun (no launcher's lock id), forked warm: its refusal is the subject, not its
            # interpreter's start.
            rank0 = start_run(1, config, run_dir, log=tmp_path / "rank0.log", **{LOCK_ID_ENV: "0123456789abcdef"})
            rank0_code = rank0.wait(timeout=300)
            after_rank0 = tree_state(run_dir)
        finally:
            for process in frozen:
                process.send_signal(signal.SIGCONT)
        assert second.returncode == 2, second.stderr[-3000:]
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and second.stdout == "", second.stderr
        assert re.fullmatch(rf"roformer pretrain: error: --run-dir {re.escape(str(run_dir))}: in use by roformer "
                            rf"pretrain \(pid {first.pid} on {re.escape(os.uname().nodename)}, since "
                            rf"\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d, refreshed \d+ s ago\); one job per run directory: "
                            rf"wait for it to end or stop it \(lock file {re.escape(str(lock_path(run_dir)))}\)",
                            lines[0]), lines[0]
        assert after == before  # nothing written, not even the launcher's log
        rank0_output = (tmp_path / "rank0.log").read_text()
        assert rank0_code == 2, rank0_output[-3000:]
        assert rank0_output.strip().splitlines()[-1].startswith(
            f"pretrain (rank 0): error: --run-dir {run_dir}: in use by roformer pretrain (pid {first.pid} ")
        assert after_rank0 == before

        first.send_signal(signal.SIGINT)
        assert first.wait(timeout=300) == 128 + signal.SIGINT, log.read_text()[-3000:]
    finally:
        if first.poll() is None:
            for process in job_processes(first):
                process.kill()
    assert not lock_path(run_dir).exists()  # the lock ended with its job

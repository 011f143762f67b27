"""A stop at any moment of `roformer pretrain` is honoured (issue 49, row 5): Ctrl-C, SIGTERM or SIGHUP sent 1, 2,
4 and 8 s after the launch (before the ranks exist, while they start, while they train; the last one no earlier
than the job's first output, so that one stop lands on a launched job however loaded the machine) ends the run at the
first step boundary after it with a resumable checkpoint (or, when it came before the job was launched,
with nothing written), and the same command then trains a stopped run to the end. SIGHUP (a terminal or ssh
session closing, issue 63) is a stop like SIGTERM: it used to kill the command silently (129) and leave its
ranks training; now the command exits 129 after the ranks' checkpoint and no process of the job is left."""
from __future__ import annotations

import re
import signal
import time

import psutil

from launcher.checkpoint.catalogue import CheckpointCatalogue
from launcher.run_dir.layout import RunDir
from launcher.train.metrics import read_metrics
from tests.support.helpers import free_port, metrics_steps, newest_checkpoint, roformer, roformer_env, \
    start_roformer, tiny_run_config

TOTAL_STEPS = 80  # more than a fast machine trains by the last stop (a tiny 16-step run takes 10 s there)
STOPS = [(1.0, signal.SIGINT), (2.0, signal.SIGTERM), (4.0, signal.SIGINT), (8.0, signal.SIGHUP)]
FORWARD_SECONDS = 1.0  # at most from `roformer pretrain` to its ranks (its poll, its scan), on a loaded machine
LAUNCH_TIMEOUT = 300


def launched(run_dir) -> bool:
    """The job's log has a line of the job's own output (not the command's `===` header or its `roformer pretrain:`
    notes): its runner runs, and the command's stop handlers were set before it started."""
    log = RunDir(run_dir).launcher_log
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    return any(not line.startswith(("===", "roformer pretrain:")) for line in lines)


def still_running(processes: list[psutil.Process]) -> list[psutil.Process]:
    left = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                left.append(process)
        except psutil.NoSuchProcess:
            pass
    return left


def test_a_stop_at_any_moment_of_the_start_ends_the_run_at_its_first_step_boundary(tiny_data, tmp_path):
    stages = [{"name": "only", "max_seq_len": 16, "global_batch_size": 4, "steps": TOTAL_STEPS}]
    config = tiny_run_config(tmp_path / "config", tiny_data, stages=stages, checkpoint={"every_steps": 0},
                             logging={"valid_every": 0, "plots": False})
    landed = []
    for delay, signum in STOPS:
        run_dir, log = tmp_path / f"run-{delay:g}", tmp_path / f"pretrain-{delay:g}.out"
        args = ("pretrain", "--num_gpus", "2", "--master_port", str(free_port()), "--config", str(config),
                "--run-dir", str(run_dir), "--report-to", "none")
        proc = start_roformer(*args, env=roformer_env(), log=log)
        job: list[psutil.Process] = []
        try:
            time.sleep(delay)
            if (delay, signum) == STOPS[-1]:  # on a loaded machine the command may not have launched the job yet
                deadline = time.monotonic() + LAUNCH_TIMEOUT
                while not launched(run_dir):
                    assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                    time.sleep(0.2)
            job = psutil.Process(proc.pid).children(recursive=True)
            sent = time.time()
            proc.send_signal(signum)
            assert proc.wait(timeout=300) == 128 + signum, log.read_text()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
        assert not still_running(job)  # nothing of the job outlives the command
        output = log.read_text()
        assert "Traceback" not in output and "error" not in output.lower(), output[-3000:]
        steps = metrics_steps(run_dir) if run_dir.is_dir() else []
        point = newest_checkpoint(run_dir) if run_dir.is_dir() else None
        if "received: the ranks finish their step" not in output:  # before the job's launch: nothing of a run
            assert not steps and point is None and not (run_dir / "checkpoints").exists(), output[-3000:]
            landed.append((delay, "before the launch", 0))
            continue
        # The job was launched (its ranks starting, about to, or training): they stop with a checkpoint.
        assert steps == list(range(1, steps[-1] + 1)) and steps[-1] < TOTAL_STEPS, output[-3000:]
        assert point is not None and point.step == steps[-1], output[-3000:]  # the stop's own checkpoint
        assert [e.tag for e in CheckpointCatalogue.scan(run_dir).entries] == [point.tag]  # nothing half-written
        startup = [r for r in read_metrics(run_dir, "event") if r.get("event") == "startup"]
        if sent + FORWARD_SECONDS < startup[0]["time"]:  # the ranks had it before their first step: that step
            assert steps == [1], output[-3000:]          # carries it to every rank, then the checkpoint
            landed.append((delay, "during start-up", 1))
        else:  # the step the ranks were in when it reached them, at most the next, then the checkpoint
            announced = re.findall(r"^stop requested \((?:SIGTERM|SIGINT|SIGHUP)\): finishing step (\d+), then a "
                                   r"checkpoint", output, flags=re.M)
            assert len(announced) == 1 and steps[-1] <= int(announced[0]) + 1, (announced, steps[-1])
            landed.append((delay, "around the first steps", steps[-1]))
        assert f"the newest complete checkpoint is {point.tag}: run the same command again" in output

    started = [delay for delay, where, _ in landed if where != "before the launch"]
    assert started, landed  # the ranks' start-up: the issue's case
    run_dir = tmp_path / f"run-{started[0]:g}"  # the same command trains it to the end (resumes: tests/multirank)
    result = roformer("pretrain", "--num_gpus", "2", "--master_port", str(free_port()), "--config", str(config),
                      "--run-dir", str(run_dir), "--report-to", "none", timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert metrics_steps(run_dir) == list(range(1, TOTAL_STEPS + 1))


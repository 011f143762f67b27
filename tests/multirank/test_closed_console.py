"""A rank whose console goes away (pdsh killed, an ssh session lost) still stops with its checkpoint.

Two ranks under DeepSpeed's per-node launcher, each behind the rank guard as docs/multinode.md's plain
route adds it (`--no_local_rank --module launcher.launch.rank_process launcher.train.rank_entry ...`), with
stdout and stderr one pipe to this test. After step STOP_AFTER_STEP the test closes its end of the pipe,
then sends SIGTERM to the launcher (what DeepSpeed's runner makes every node's launcher get after killing
pdsh): rank 0's stop line is the first write to find the pipe closed. The run must end with the stop
checkpoint at the stop step, rank 0's lines in RUN_DIR/logs/rank0.log, and a resume must continue it
exactly (fp32, no dropout: every step's loss within 1e-6 of tests/conftest.py's uninterrupted run); the resume's
ranks are forked warm (tests/support/fork_server.py): its console is not the subject, the stop checkpoint is.
The same for `roformer pretrain` itself, whose console is closed from the start.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

from tests.support.helpers import (
    NO_DROPOUT,
    RANK_ENTRY,
    REPO,
    TINY_TOTAL_STEPS,
    events,
    launch_command,
    metrics_steps,
    newest_checkpoint,
    rank_env,
    roformer_env,
    run_to_end,
    tiny_run_config,
    train_losses,
)

STOP_AFTER_STEP = 7  # inside the second stage: past the first stage boundary (step 6)
TIMEOUT = 240


def guarded_command(config, run_dir, port):
    """The plain route's per-node launch with the rank guard in front of the rank entry."""
    cmd = launch_command(2, "launcher.launch.rank_process",
                         [RANK_ENTRY, "--config", str(config), "--run-dir", str(run_dir)], port=port)
    cmd.insert(cmd.index("--module"), "--no_local_rank")  # else launch.py puts --local_rank before the module
    return cmd


def run_until_step_then_close(cmd, run_dir, step: int) -> tuple[subprocess.Popen, bytes]:
    """Start `cmd` with its output a pipe read here until `step` is in metrics.jsonl; then close the pipe."""
    proc = subprocess.Popen(cmd, cwd=REPO, env=rank_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    seen = b""
    deadline = time.monotonic() + TIMEOUT
    while max(metrics_steps(run_dir), default=0) < step:
        assert proc.poll() is None and time.monotonic() < deadline, seen.decode(errors="replace")[-4000:]
        if select.select([proc.stdout], [], [], 0.2)[0]:
            seen += os.read(proc.stdout.fileno(), 1 << 16)
    proc.stdout.close()  # the console goes away: every later write of the job meets a closed pipe
    return proc, seen


def test_stop_with_the_console_closed_checkpoints_and_resumes_exactly(tmp_path, tiny_data, trainer_run):
    config = tiny_run_config(tmp_path, tiny_data, model=NO_DROPOUT, logging={"progress_bar": False})
    run_dir = tmp_path / "run"
    cmd = guarded_command(config, run_dir, port=None)
    proc, seen = run_until_step_then_close(cmd, run_dir, STOP_AFTER_STEP)
    try:
        os.kill(proc.pid, signal.SIGTERM)  # DeepSpeed's launcher passes it on to its ranks
        proc.wait(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    rank0_log = run_dir / "logs" / "rank0.log"
    assert rank0_log.is_file(), seen.decode(errors="replace")[-4000:]
    logged = rank0_log.read_text()
    (stopped,) = events(run_dir, "stopped")
    point = newest_checkpoint(run_dir)
    assert point is not None and point.sidecar.step == stopped["step"] > STOP_AFTER_STEP, logged
    assert "the reader of its stdout and stderr went away" in logged.splitlines()[0], logged
    assert "stop requested (SIGTERM): finishing step" in logged, logged
    assert f"stopped at step {stopped['step']}; checkpoints in" in logged, logged
    for log in (run_dir / "logs").glob("rank*.log"):
        assert "Traceback" not in log.read_text() and "BrokenPipeError" not in log.read_text(), log.read_text()

    run_to_end(2, config, run_dir, timeout=TIMEOUT)  # exit code 0, else its log's tail (RUN_DIR/../run.log)
    assert [e["tag"] for e in events(run_dir, "resume")] == [point.tag]
    expected, got = train_losses(trainer_run), train_losses(run_dir)
    assert sorted(got) == list(range(1, TINY_TOTAL_STEPS + 1))
    for step in range(1, TINY_TOTAL_STEPS + 1):
        assert abs(got[step] - expected[step]) <= 1e-6, (step, got[step], expected[step])
    print(f"\nconsole closed after step {STOP_AFTER_STEP}: stop checkpoint {point.tag}, resumed to "
          f"step {TINY_TOTAL_STEPS} exactly")


def test_roformer_pretrain_with_its_console_closed_still_stops_with_a_checkpoint(tmp_path, tiny_data):
    """`roformer pretrain` itself, its stdout and stderr closed from the start (an ssh session gone): the job
    runs, a SIGTERM to it still ends in the ranks' stop checkpoint, and its log has every line."""
    config = tiny_run_config(tmp_path, tiny_data)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "pretrain", "--num_gpus", "2", "--config", str(config),
                             "--run-dir", str(run_dir)], cwd=REPO, env=roformer_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True)
    proc.stdout.close()
    proc.stderr.close()
    try:
        deadline = time.monotonic() + TIMEOUT
        while max(metrics_steps(run_dir), default=0) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, proc.returncode
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    log = (run_dir / "logs" / "launcher.log").read_text()
    assert rc == 128 + signal.SIGTERM, log[-3000:]
    (stopped,) = events(run_dir, "stopped")
    assert newest_checkpoint(run_dir).sidecar.step == stopped["step"], log[-3000:]
    assert f"stopped at step {stopped['step']}; checkpoints in" in log
    assert "roformer pretrain: preempted, resumable: stopped by SIGTERM" in log, log[-3000:]

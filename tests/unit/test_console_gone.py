"""A console that goes away ends nothing (launcher/common/io.py): the process goes on, keeps its exit code, and its
later lines reach its console log (a rank's RUN_DIR/logs/rank<r>.log) or, without one, /dev/null. Real
processes with real pipes (tests/support/console_probe.py), since a redirect replaces the process's own
descriptors. Also the stop-time line (launcher/train/stop_time.py) and the DeepSpeed grace it relies on.
"""
from __future__ import annotations

import inspect
import re
import subprocess
import sys

import pytest

from launcher.train.stop_time import DEEPSPEED_LAUNCHER_GRACE_SECONDS, StopTime
from tests.support.console_probe import EXIT_CODE
from tests.support.helpers import REPO, roformer_env


def probe(mode: str, path: str, close: tuple[str, ...] = ("stdout", "stderr"), unbuffered: bool = True):
    """Run the probe; close the named pipes before it writes. Returns (exit code, what reached stderr)."""
    env = roformer_env(PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1" if unbuffered else "")
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.console_probe", mode, path], cwd=REPO, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for name in close:
        getattr(proc, name).close()
    proc.stdin.close()  # now the probe writes
    stderr = b"" if "stderr" in close else proc.stderr.read()
    if "stdout" not in close:
        proc.stdout.read()
    return proc.wait(timeout=60), stderr.decode()


@pytest.mark.parametrize("unbuffered", [True, False], ids=["python -u", "buffered"])
def test_a_rank_goes_on_into_its_console_log(tmp_path, unbuffered):
    log = tmp_path / "run" / "logs" / "rank0.log"
    log.parent.parent.mkdir()
    rc, _ = probe("rank", str(log), unbuffered=unbuffered)
    assert rc == EXIT_CODE  # not killed by the write, not 120 from the interpreter's final flush
    lines = log.read_text().splitlines()
    assert "the reader of its stdout and stderr went away; its output continues here" in lines[0]
    assert lines[1:5] == ["a rank's line after the close", "stop requested (SIGUSR1): a line from a signal handler",
                          "a print() after the close", "an unflushed print" + "x" * 10000]
    assert lines[5:] == ["to stderr"]


def test_only_the_closed_stream_is_redirected(tmp_path):
    log = tmp_path / "rank0.log"
    rc, stderr = probe("rank", str(log), close=("stdout",))
    assert rc == EXIT_CODE
    assert stderr.splitlines() == ["a rank's line after the close",
                                   "stop requested (SIGUSR1): a line from a signal handler", "to stderr"]
    logged = log.read_text().splitlines()
    assert "its stdout went away" in logged[0] and logged[1] == "a print() after the close"
    assert "to stderr" not in logged


def test_without_a_console_log_the_lines_go_nowhere(tmp_path):
    rc, _ = probe("rank", "-")
    assert rc == EXIT_CODE and list(tmp_path.iterdir()) == []


def test_a_console_log_is_not_created_without_its_run_directory(tmp_path):
    rc, _ = probe("rank", str(tmp_path / "not-yet" / "logs" / "rank0.log"))
    assert rc == EXIT_CODE and not (tmp_path / "not-yet").exists()  # a refused start leaves no RUN_DIR


KEPT = """
import sys
from pathlib import Path
from launcher.common.io import keep_console, write_line_kept
keep_console(Path(sys.argv[1]))
write_line_kept("stop requested (SIGTERM): finishing step 9, then a checkpoint")
sys.stdin.read()
write_line_kept("stopped at step 9; checkpoints in RUN_DIR/checkpoints")
"""


def test_the_lines_of_a_stop_are_kept_in_the_log_whether_or_not_the_console_carried_them(tmp_path):
    # A console that takes a line may still lose it (pdsh killed with it in its pipe): such lines go to the
    # log as well, once each; after the console went away they land there as every other line.
    log = tmp_path / "logs" / "rank0.log"
    proc = subprocess.Popen([sys.executable, "-c", KEPT, str(log)], cwd=REPO, env=roformer_env(PYTHONPATH=str(REPO)),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stderr.readline().decode()
    proc.stderr.close()
    proc.stdin.close()
    assert proc.wait(timeout=60) == 0
    assert first == "stop requested (SIGTERM): finishing step 9, then a checkpoint\n"
    lines = log.read_text().splitlines()
    assert lines[0] == first.strip() and "went away" in lines[1]
    assert lines[2:] == ["stopped at step 9; checkpoints in RUN_DIR/checkpoints"]


@pytest.mark.parametrize("unbuffered", [True, False], ids=["python -u", "buffered"])
def test_roformer_pretrain_goes_on_and_logs_everything(tmp_path, unbuffered):
    rc, _ = probe("launcher", str(tmp_path), unbuffered=unbuffered)
    assert rc == EXIT_CODE
    logged = (tmp_path / "logs" / "launcher.log").read_text().splitlines()
    assert logged[1:] == ["a job line after the close", "roformer pretrain: a note after the close",
                          "roformer pretrain: the restart loop's line"]


def test_deepspeed_launcher_grace_is_what_stop_time_assumes():
    from deepspeed.launcher import launch

    source = inspect.getsource(launch.terminate_process_tree)
    assert re.search(r"wait_procs\(children, timeout=(\d+)\)", source).group(1) == \
        f"{DEEPSPEED_LAUNCHER_GRACE_SECONDS:g}"


def stop_time(grace=120.0, history=()):
    said = []
    return StopTime(grace, said.append, history), said


def test_a_stop_that_fits_says_nothing():
    timer, said = stop_time()
    for _ in range(30):
        timer.step(2.0)
    timer.checkpoint(20.0)
    assert timer.estimate() == 24.0 and said == []


def test_a_stop_longer_than_deepspeeds_grace_is_said_once():
    timer, said = stop_time()
    timer.step(4.0)
    timer.checkpoint(25.0)
    timer.checkpoint(26.0)
    assert len(said) == 1 and "a stop here takes about 33 s" in said[0]
    assert "more than the 30 s DeepSpeed's per-node launcher gives its ranks" in said[0]


def test_a_stop_longer_than_the_preemption_grace_names_it():
    timer, said = stop_time(grace=20.0)
    timer.step(1.0)
    timer.checkpoint(25.0)
    assert len(said) == 1 and "more than restarts.preemption_grace_seconds (20 s)" in said[0]


def test_a_resume_says_it_at_start_from_the_recorded_run():
    history = [{"kind": "train", "step": s, "step_time_s": 3.0} for s in range(1, 41)]
    history.append({"kind": "event", "event": "checkpoint", "step": 40, "seconds": 31.0})
    _, said = stop_time(history=history)
    assert len(said) == 1 and "up to 2 steps of 3.0 s and a checkpoint save of 31.0 s" in said[0]
    _, said = stop_time(history=history[:-1])  # no checkpoint recorded yet: nothing to say
    assert said == []

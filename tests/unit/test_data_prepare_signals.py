"""Ctrl-C reaches `roformer data prepare` however it was started (issue 20, section 4): started as a
background job of a script (SIGINT inherited as ignored: Python then raised no KeyboardInterrupt and
the SIGINT was dropped, the preparation ran to its end), and as a terminal's Ctrl-C does, to the whole
process group while the worker pool is starting (each worker got its own KeyboardInterrupt in the
middle of its imports and printed a traceback). Real processes, real text, real worker pool."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

from tests.support.corpus_files import english_paragraphs, write_jsonl
from tests.support.helpers import REPO, roformer_env

STOPPED = "roformer data: stopped by SIGINT (Ctrl-C)"


def _corpus(root, copies: int = 12):
    paragraphs = english_paragraphs(limit_files=40)
    return write_jsonl(root / "en.jsonl", [f"{p} ({k})" for k in range(copies) for p in paragraphs])


def _spawn(args: list[str], preexec_fn=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "launcher", *args], cwd=REPO, env=roformer_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                            start_new_session=True, preexec_fn=preexec_fn)


def _read_until(proc: subprocess.Popen, prefix: str) -> str:
    line = proc.stderr.readline()
    while line and not line.startswith(prefix):
        line = proc.stderr.readline()
    assert line.startswith(prefix), line
    return line


def _as_a_background_job_of_a_script() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # what `cmd &` in a non-interactive shell does


def test_ctrl_c_stops_data_prepare_started_with_sigint_ignored(tmp_path):
    out = tmp_path / "prepared"
    proc = _spawn(["data", "prepare", "--input", str(_corpus(tmp_path)), "--out", str(out), "--vocab-size", "2000"],
                  preexec_fn=_as_a_background_job_of_a_script)
    _read_until(proc, "reading:")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, err
    assert err.rstrip().splitlines()[-1] == STOPPED, err
    assert not out.exists()


def test_ctrl_c_to_the_process_group_while_the_worker_pool_starts(tmp_path):
    out = tmp_path / "prepared"
    sources = [write_jsonl(tmp_path / f"part{i}.jsonl", [f"{p} ({i})" for p in english_paragraphs(limit_files=10)])
               for i in range(4)]
    proc = _spawn(["data", "prepare", "--input", *map(str, sources), "--out", str(out), "--vocab-size", "1000",
                   "--workers", "2"])
    _read_until(proc, "scanning 4 files")  # printed right after the pool was created
    _wait_for_python_in_workers(proc.pid, 2)  # the workers' Python is up: they are importing, not yet working
    os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the foreground process group, workers too
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, err
    assert err.rstrip().splitlines()[-1] == STOPPED, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert not out.exists()
    # Nothing of the command is left in its process group: the pool's workers were terminated, and
    # multiprocessing's resource tracker ends once its pipe from the command closes (shortly after it).
    deadline = time.monotonic() + 30
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _group_alive(proc.pid), "a process of the command outlived it"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _wait_for_python_in_workers(pid: int, count: int) -> None:
    """Until `count` pool workers of `pid` handle SIGINT themselves (caught or ignored in
    /proc/PID/status). Before that, SIGINT's default action ends a worker silently; after it, a worker
    that catches it raises KeyboardInterrupt in the middle of its imports."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        workers = [p for p in psutil.Process(pid).children() if "multiprocessing.spawn" in " ".join(p.cmdline())
                   and "resource_tracker" not in " ".join(p.cmdline())]
        if len(workers) == count and all(_handles_sigint(p.pid) for p in workers):
            return
        time.sleep(0.05)
    raise AssertionError(f"{count} pool workers did not start")


def _handles_sigint(pid: int) -> bool:
    status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines() if ":" in line)
    bit = 1 << (signal.SIGINT - 1)
    return bool((int(status["SigCgt"], 16) | int(status["SigIgn"], 16)) & bit)


# A stop whose exception Python could only print: the signal's handler ran while a generator was being
# finalised (the encoding pass leaves each file's document stream unfinished at its last kept document),
# where an exception is "ignored" and the preparation went on to publish. The stop here is a real signal,
# sent by the process to itself at that moment (the one thing a test cannot time from outside).
STOP_WHILE_A_STREAM_CLOSES = """
import os, signal, sys
import data_pipeline.prepare as prepare
from launcher.cli import main

real = prepare.iter_raw_documents

def stream(*args):
    try:
        yield from real(*args)
    except GeneratorExit:  # left unfinished: closed when collected, where Python can only print an exception
        os.kill(os.getpid(), signal.{signal})
        sum(range(1000))  # the handler runs here, inside the close
        raise

prepare.iter_raw_documents = stream
sys.exit(main(sys.argv[1:]))
"""


def test_a_stop_that_python_could_only_print_still_stops_data_prepare_before_it_publishes(tmp_path, s3_server):
    """Exit 128+N with the stop's line, nothing published: not the folder, not (--out s3://) an upload."""
    corpus = _corpus(tmp_path, copies=1)
    client = s3_server.client()
    for name, out in (("SIGINT", str(tmp_path / "prepared")), ("SIGTERM", "s3://roformer-test/stopped-prepare")):
        result = subprocess.run([sys.executable, "-c", STOP_WHILE_A_STREAM_CLOSES.format(signal=name), "data",
                                 "prepare", "--input", str(corpus), "--out", out, "--vocab-size", "500"],
                                cwd=REPO, env=roformer_env(**s3_server.env()), capture_output=True, text=True,
                                timeout=300)
        signum = getattr(signal, name)
        assert "Exception ignored" in result.stderr, result.stderr  # the case: the exception was swallowed
        assert result.returncode == 128 + signum, result.stderr
        assert result.stderr.rstrip().splitlines()[-1].startswith(f"roformer data: stopped by {name}"), result.stderr
    assert not (tmp_path / "prepared").exists()
    assert client.list_objects_v2(Bucket="roformer-test", Prefix="stopped-prepare/")["KeyCount"] == 0


# A stop that lands in an import leaves the module half-initialised, and what uses it next fails with an
# error of its own (seen: `AttributeError: module 'numpy' has no attribute 'matrix'` after a Ctrl-C during
# numpy's import, a traceback and exit 1). Replayed here: a real SIGINT whose exception the code it lands
# in swallows, then that code's own error.
STOP_THEN_ITS_AFTERMATH = """
import os, signal, sys
import data_pipeline.prepare as prepare
from launcher.cli import main

def resolve_sources(specs):
    try:
        os.kill(os.getpid(), signal.SIGINT)
        sum(range(1000))
    except KeyboardInterrupt:
        pass  # what an interrupted import machinery does with it
    raise AttributeError("module 'numpy' has no attribute 'matrix'")

prepare.resolve_sources = resolve_sources
sys.exit(main(sys.argv[1:]))
"""


def test_an_error_that_follows_a_stop_is_the_stop(tmp_path):
    corpus = write_jsonl(tmp_path / "en.jsonl", english_paragraphs(limit_files=2))
    result = subprocess.run([sys.executable, "-c", STOP_THEN_ITS_AFTERMATH, "data", "prepare", "--input", str(corpus),
                             "--out", str(tmp_path / "prepared"), "--vocab-size", "500"],
                            cwd=REPO, env=roformer_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 128 + signal.SIGINT, result.stderr
    assert result.stderr.rstrip().splitlines()[-1] == STOPPED and "Traceback" not in result.stderr, result.stderr
    assert not (tmp_path / "prepared").exists()

"""`pytest --cpu-report DIR` (tests/support/cpu_report.py): each test's CPU seconds, its child processes' included,
and the session's teardown (the servers its fixtures kept) on a line of its own."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.support.cpu_report import SESSION_TEARDOWN
from tests.support.helpers import REPO

TESTS = '''
import pathlib, subprocess, sys, time

import pytest

@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """A server the session keeps: 0.3 CPU-s of work (its CPU reaches pytest when it is stopped), then idle."""
    done = tmp_path_factory.mktemp("server") / "done"
    work = f"import pathlib, time\\nend = time.process_time() + 0.3\\nwhile time.process_time() < end: pass\\n" \\
           f"pathlib.Path({str(done)!r}).touch()\\ntime.sleep(120)"
    proc = subprocess.Popen([sys.executable, "-c", work])
    yield proc
    while not done.exists():
        time.sleep(0.05)
    proc.terminate()
    proc.wait()

def test_spins_a_child_for_half_a_cpu_second(server):
    spin = "import time\\nend = time.process_time() + 0.5\\nwhile time.process_time() < end: pass"
    subprocess.run([sys.executable, "-c", spin], check=True)

def test_sleeps():
    import time
    time.sleep(0.3)
'''


def test_each_test_is_charged_the_cpu_of_the_processes_it_waited_for(tmp_path):
    (tmp_path / "test_work.py").write_text(TESTS)
    report = tmp_path / "report"
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                             "tests.support.cpu_report", "--cpu-report", str(report), str(tmp_path / "test_work.py")],
                            cwd=tmp_path, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    (written,) = report.glob("cpu-*.json")
    tests = {record["test"].split("::")[-1]: record for record in json.loads(written.read_text())["tests"]}
    assert tests["test_spins_a_child_for_half_a_cpu_second"]["cpu_s"] >= 0.5  # the child's, not this process's
    assert tests["test_sleeps"]["wall_s"] >= 0.3 and tests["test_sleeps"]["cpu_s"] < 0.2
    # The session fixture's server, stopped in the last test's teardown: its own line, not the last test's.
    assert tests[SESSION_TEARDOWN]["cpu_s"] >= 0.3, tests
    summary = subprocess.run([sys.executable, "-m", "tests.support.cpu_report", str(report), "--top", "1"], cwd=REPO,
                             capture_output=True, text=True, timeout=60)
    assert summary.returncode == 0, summary.stderr
    assert summary.stdout.splitlines()[-1].endswith("::test_spins_a_child_for_half_a_cpu_second")  # the one on top

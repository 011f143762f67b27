"""`pytest --cpu-report DIR`: the CPU seconds (user + system) each test cost, one JSON file per pytest process
(DIR/cpu-<pid>.json, most expensive first). On the 2-core reference machine the suite is CPU-bound (both lanes
keep the cores ~90-95% busy), so a test's CPU seconds, not its wall time, are what it costs the suite.

A test's figure is its own process's CPU during its setup, call and teardown plus that of every child process
that ended and was waited for meanwhile: the jobs it ran, their launchers, wrappers and ranks (each waits for its
own children, so their CPU reaches the test), and the jobs forked by the session's warm process that ended meanwhile
(tests/support/fork_server.py reports their CPU). A session fixture is counted in the first test that uses it; a
server a fixture keeps running is counted when it is stopped, and one a session fixture stops is counted in
SESSION_TEARDOWN, not in the last test: the namespace cluster's sshd reaps every rank the cluster tests start
over ssh, so its CPU reaches pytest only when the session stops it (once 180 CPU-s, read as the side lane's
last test, test_remote_training's paused server, whose pause is idle). Loaded by setup.cfg's addopts.

    python -m tests.support.cpu_report DIR [--top N] [--yardstick]
        # each file's total, then the N most expensive tests; --yardstick: the machine's speed that day

The host's speed varies from day to day (the same tree: 22.9 and 29.0 min, all tests' CPU seconds 26% apart), so
`.ci/run` prints a yardstick beside the figures: the best of three fresh `import torch`, CPU seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path

import pytest

_records: list[dict] = []
_session_teardown: dict = {}
"""The CPU of the session's teardown (the last test's teardown that stops the session fixtures)."""
SESSION_TEARDOWN = "(session teardown: the servers and clusters session fixtures kept, with every job they reaped)"


def pytest_addoption(parser) -> None:
    parser.addoption("--cpu-report", metavar="DIR", default=None,
                     help="write the CPU seconds of every test to DIR/cpu-<pid>.json (tests/support/cpu_report.py)")


def cpu_seconds() -> float:
    """This process's CPU seconds and its waited-for children's, user + system."""
    from tests.support.fork_server import cpu_not_yet_reaped

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + cpu_not_yet_reaped()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not item.config.getoption("cpu_report"):
        yield
        return
    cpu, wall = cpu_seconds(), time.monotonic()
    yield
    ended = {"cpu_s": cpu_seconds() - cpu - _session_teardown.get("cpu_s", 0.0),
             "wall_s": time.monotonic() - wall - _session_teardown.get("wall_s", 0.0)}
    _records.append({"test": item.nodeid, **{k: round(v, 2) for k, v in ended.items()}})
    if _session_teardown:
        _records.append({"test": SESSION_TEARDOWN, **{k: round(v, 2) for k, v in _session_teardown.items()}})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    if nextitem is not None or not item.config.getoption("cpu_report"):
        yield
        return
    cpu, wall = cpu_seconds(), time.monotonic()  # the last test: its teardown stops every session fixture
    yield
    _session_teardown.update(cpu_s=cpu_seconds() - cpu, wall_s=time.monotonic() - wall)


def pytest_sessionfinish(session) -> None:
    directory = session.config.getoption("cpu_report")
    if not directory:
        return
    path = Path(directory) / f"cpu-{os.getpid()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tests = sorted(_records, key=lambda record: -record["cpu_s"])
    path.write_text(json.dumps({"cpu_s": round(sum(r["cpu_s"] for r in tests), 1), "tests": tests}, indent=1) + "\n")


def summary(directory: Path, top: int = 15) -> str:
    """The report files of DIR: each one's total CPU and wall seconds, then the `top` most expensive tests."""
    lines, tests = [], []
    for path in sorted(directory.glob("cpu-*.json")):
        report = json.loads(path.read_text())
        wall = sum(test["wall_s"] for test in report["tests"])
        lines.append(f"{path.name}: {report['cpu_s']:,.0f} CPU-s in {len(report['tests'])} tests ({wall:,.0f} s of tests)")
        tests += report["tests"]
    lines.append(f"the {top} most expensive tests (CPU-s, wall s):")
    lines += [f"  {test['cpu_s']:7.1f} {test['wall_s']:7.1f}  {test['test']}"
              for test in sorted(tests, key=lambda test: -test["cpu_s"])[:top]]
    return "\n".join(lines)


def yardstick(rounds: int = 3) -> float:
    """Best CPU seconds (user + system) of a fresh interpreter importing torch, of `rounds`."""
    import subprocess
    import sys

    best = float("inf")
    for _ in range(rounds):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        best = min(best, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return best


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="the CPU seconds of a suite run's tests (pytest --cpu-report DIR)")
    parser.add_argument("directory", type=Path)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--yardstick", action="store_true", help="also print the machine's speed (import torch)")
    args = parser.parse_args()
    print(summary(args.directory, args.top))
    if args.yardstick:
        print(f"machine speed: a fresh `import torch` costs {yardstick():.2f} CPU-s (best of 3; README "
              f"'Tests' gives it beside each CI figure)")

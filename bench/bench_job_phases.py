"""Where a short `roformer pretrain` job's wall time goes, this checkout beside an earlier revision.

    DS_ACCELERATOR=cpu .venv/bin/python bench/bench_job_phases.py [--before REV] [--rounds 3] [--steps 8]
    DS_ACCELERATOR=cpu .venv/bin/python bench/bench_job_phases.py --before-python OTHER_VENV/bin/python

The second form compares interpreters instead of revisions: `before` is this checkout run by another Python
environment's interpreter (the same packages; DeepSpeed's launcher and the ranks inherit it), written to
bench/results/job_phases_python.json.

A tiny 2-rank run (the tests' model and corpus shape: tests/support/helpers.tiny_run_config on a prepared
tiny corpus made here) is launched as the real command, once per round for each code (`before`: REV's tree from
`git archive`, run from there; `after`: this checkout), alternating. Its process tree is watched every 20 ms
(psutil), and the console lines are timed, giving seconds from the command's start to:
  launch        `roformer pretrain` printed its launch line (its imports and every start-up check done)
  ranks_start   the rank processes exist (DeepSpeed's per-node launcher has imported and spawned them)
  first_step    the console's `step 1/N` line (the ranks' start-up: imports, rendezvous, engine)
  finished      `finished at step N`
  ranks_exit    the last rank process is gone
  launcher_exit DeepSpeed's per-node launcher is gone
  exit          the command returned
and the CPU seconds (user + system) each kind of process spent: `cpu_command` (`roformer pretrain` itself),
`cpu_launcher` (DeepSpeed's per-node launcher), `cpu_wrappers` (launcher/launch/rank_process.py, one per rank),
`cpu_ranks` (all ranks), as last seen by the watcher, and `cpu_total`, the whole tree's exact figure
(getrusage of the reaped children). On a machine the suite keeps busy (2 cores: CI), CPU seconds, not wall
time, are what a job costs the suite. Medians per code in `summary`; every run in `runs`; the load average
before each run. Writes bench/results/job_phases.json. The suite's multi-rank tests start ~150 such jobs (most
through the launcher directly, tests/support/helpers.launch_command), so a second per job is minutes of CI.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.helpers import extract_archive, free_port, roformer_env, tiny_run_config  # noqa: E402

MARKS = ("launch", "ranks_start", "first_step", "finished", "ranks_exit", "launcher_exit", "exit")
CPU_KINDS = ("command", "launcher", "wrappers", "ranks")
FIGURES = MARKS + tuple(f"cpu_{kind}" for kind in CPU_KINDS) + ("cpu_total",)


MODULE_KINDS = {"launcher.launch.deepspeed_processes": "launcher", "launcher.launch.rank_process": "wrappers",
                "launcher.train.rank_entry": "ranks"}


def process_kind(argv: list[str]) -> str | None:
    """Which part of a job a process of its tree is (CPU_KINDS, by the module it runs: `python -u -m MODULE ...`),
    None for anything else."""
    module = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else ""
    return MODULE_KINDS.get(module)


def checkout(revision: str, workdir: Path) -> Path:
    """REV's tracked tree under workdir (git archive), to run the command from."""
    archive, tree = workdir / f"{revision}.tar", workdir / revision
    subprocess.run(["git", "-C", str(REPO), "archive", "-o", str(archive), revision], check=True)
    extract_archive(archive, tree)
    return tree


def timed_job(code_dir: Path, config: Path, run_dir: Path, python: str = sys.executable) -> dict:
    """One `roformer pretrain` of `config` run from `code_dir` by `python`: seconds from its start to each of MARKS."""
    env = {**roformer_env(), "PYTHONPATH": str(code_dir)}
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.Popen([python, "-m", "launcher", "pretrain", "--num_gpus", "2", "--master_port",
                             str(free_port()), "--config", str(config), "--run-dir", str(run_dir), "--report-to",
                             "none"], cwd=code_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    marks: dict[str, float] = {}
    lifetimes: dict[int, list] = {}  # pid -> [first seen, gone, kind]
    cpu_seen: dict[int, tuple[str, float]] = {}  # pid -> (kind, CPU seconds when last seen)

    def watch() -> None:
        while proc.poll() is None:
            now = time.monotonic() - start
            try:
                command = psutil.Process(proc.pid)
                children = command.children(recursive=True)
                times = command.cpu_times()
                cpu_seen[proc.pid] = ("command", times.user + times.system)
            except psutil.NoSuchProcess:
                return
            alive = set()
            for child in children:
                try:
                    if child.status() == psutil.STATUS_ZOMBIE:
                        continue
                    argv = child.cmdline()
                    times = child.cpu_times()
                except psutil.NoSuchProcess:
                    continue
                kind = process_kind(argv)
                if kind:
                    cpu_seen[child.pid] = (kind, times.user + times.system)
                if kind in ("ranks", "launcher"):
                    alive.add(child.pid)
                    lifetimes.setdefault(child.pid, [now, None, kind])
            for pid, record in lifetimes.items():
                if record[1] is None and pid not in alive:
                    record[1] = now
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    for line in proc.stdout:
        now = time.monotonic() - start
        if line.startswith("roformer pretrain: world size"):
            marks.setdefault("launch", now)
        elif line.startswith("step 1/"):
            marks.setdefault("first_step", now)
        elif line.startswith("finished at step"):
            marks.setdefault("finished", now)
    proc.wait()
    marks["exit"] = time.monotonic() - start
    children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    watcher.join()
    if proc.returncode != 0:
        raise RuntimeError(f"the job failed (exit code {proc.returncode}): {run_dir}")
    ranks = [v for v in lifetimes.values() if v[2] == "ranks"]
    launchers = [v for v in lifetimes.values() if v[2] == "launcher"]
    marks["ranks_start"] = max(v[0] for v in ranks)
    marks["ranks_exit"] = max(v[1] or marks["exit"] for v in ranks)
    marks["launcher_exit"] = max(v[1] or marks["exit"] for v in launchers)
    for kind in CPU_KINDS:
        marks[f"cpu_{kind}"] = sum(cpu for seen_kind, cpu in cpu_seen.values() if seen_kind == kind)
    marks["cpu_total"] = sum(getattr(children_after, field) - getattr(children_before, field)
                             for field in ("ru_utime", "ru_stime"))
    return {figure: round(marks[figure], 3) for figure in FIGURES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="aef1b4e", help="the earlier revision (git)")
    parser.add_argument("--before-python", metavar="PYTHON", default=None,
                        help="compare interpreters: `before` is this checkout run by PYTHON (another venv's)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None, help="default: bench/results/job_phases.json, "
                        "job_phases_python.json with --before-python")
    args = parser.parse_args()
    name = "job_phases_python.json" if args.before_python else "job_phases.json"
    out = args.out or REPO / "bench" / "results" / name
    from tests.support.corpus_files import prepared_dir

    with tempfile.TemporaryDirectory(prefix="job-phases-") as tmp:
        workdir = Path(tmp)
        codes = {"before": REPO if args.before_python else checkout(args.before, workdir), "after": REPO}
        pythons = {"before": args.before_python or sys.executable, "after": sys.executable}
        data = prepared_dir(_Factory(workdir))
        config = tiny_run_config(workdir / "config", data, stages=[
            {"name": "one", "max_seq_len": 16, "global_batch_size": 4, "steps": args.steps}],
            checkpoint={"every_steps": 0}, logging={"valid_every": 0, "plots": False})
        runs = []
        for round_index in range(args.rounds):
            for code, code_dir in codes.items():
                load = os.getloadavg()[0]
                marks = timed_job(code_dir, config, workdir / f"run-{code}-{round_index}", pythons[code])
                runs.append({"code": code, "round": round_index, "load_avg_1m": round(load, 2), **marks})
                print(json.dumps(runs[-1]), flush=True)
    summary = {code: {figure: statistics.median(r[figure] for r in runs if r["code"] == code) for figure in FIGURES}
               for code in codes}
    for figures in summary.values():
        figures["after_finished"] = round(figures["exit"] - figures["finished"], 3)
    result = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
              "before": {"python": python_build(pythons["before"])} if args.before_python else args.before,
              "after_python": python_build(sys.executable), "steps": args.steps, "summary": summary, "runs": runs}
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


def python_build(python: str) -> dict:
    """Which interpreter `python` is: its version, the executable it resolves to, and whether that executable loads
    libpython as a shared library (a position-independent build: slower than a static one)."""
    probe = ("import json, os, sys; print(json.dumps({'version': sys.version.split()[0], 'executable': "
             "os.path.realpath(sys.executable), 'shared_libpython': any('libpython' in line for line in "
             "open('/proc/self/maps'))}))")
    return json.loads(subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True).stdout)


class _Factory:
    """tmp_path_factory's one method prepared_dir uses, under `root`."""

    def __init__(self, root: Path):
        self.root = root

    def mktemp(self, name: str) -> Path:
        path = self.root / name
        path.mkdir()
        return path


if __name__ == "__main__":
    main()

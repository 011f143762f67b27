"""What a test's tiny 2-rank job costs forked warm (tests/support/fork_server.py) beside started through DeepSpeed's
per-node launcher, the way the suite starts them (tests/support/helpers.start_run).

    DS_ACCELERATOR=cpu .venv/bin/python bench/bench_warm_jobs.py [--rounds 5]

The tests' tiny run (helpers.tiny_run_config on the tests' prepared corpus, 16 steps, checkpoints and validation as
the tests have them) through the test rank entry, both ways alternating, each round a fresh run directory. Per
job: wall seconds from start to exit and CPU seconds (user + system) of the whole job: getrusage of the reaped
children for the launcher's, the fork server's report (os.wait4 of the job, its ranks included) for the warm one.
The warm process's own start (its imports, once per pytest process) is measured apart. Medians and every job in
bench/results/warm_jobs.json with the load average before each job; run it on a quiet machine.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support import fork_server as warm  # noqa: E402
from tests.support.corpus_files import prepared_dir  # noqa: E402
from tests.support.helpers import TEST_RANK_ENTRY, fork_server, start_run, stop_fork_server, tiny_run_config  # noqa: E402


class TmpFactory:
    """pytest's tmp_path_factory as prepared_dir uses it: mktemp(name) -> a new folder."""

    def __init__(self, root: Path):
        self.root = root

    def mktemp(self, name: str) -> Path:
        path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.root))
        return path


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_job(how: str, root: Path, data: Path, index: int) -> dict:
    run_dir = root / f"{how}-{index}"
    config = tiny_run_config(root, data, name=f"{how}-{index}.yaml")
    load = os.getloadavg()[0]
    cpu_before, reported_before, start = children_cpu(), warm.cpu_not_yet_reaped(), time.monotonic()
    proc = start_run(2, config, run_dir, module=TEST_RANK_ENTRY, warm=how == "warm")
    code = proc.wait(timeout=600)
    wall = time.monotonic() - start
    cpu = children_cpu() - cpu_before + warm.cpu_not_yet_reaped() - reported_before
    assert code == 0, (root / f"{run_dir.name}.log").read_text()[-3000:]
    return {"how": how, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "load_before": round(load, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "warm_jobs.json")
    args = parser.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    with tempfile.TemporaryDirectory(prefix="bench-warm-jobs.") as tmp:
        root = Path(tmp)
        data = prepared_dir(TmpFactory(root))
        cpu_before, start = children_cpu(), time.monotonic()
        fork_server()  # the warm process: started once per pytest process
        server_start = {"wall_s": round(time.monotonic() - start, 2)}
        jobs = []
        for index in range(args.rounds):
            for how in ("launcher", "warm") if index % 2 == 0 else ("warm", "launcher"):
                jobs.append(one_job(how, root, data, index))
                print(json.dumps(jobs[-1]), flush=True)
        stop_fork_server()
        # The server's own CPU: everything it and its jobs cost, less the jobs' (reported above).
        server_start["cpu_s"] = round(children_cpu() - cpu_before - sum(j["cpu_s"] for j in jobs), 2)
    summary = {how: {key: statistics.median(j[key] for j in jobs if j["how"] == how) for key in ("wall_s", "cpu_s")}
               for how in ("launcher", "warm")}
    result = {"what": "a tiny 2-rank test job (16 steps) started through DeepSpeed's launcher vs forked warm",
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
              "summary": summary, "warm_process_start": server_start, "jobs": jobs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"summary": summary, "warm_process_start": server_start}))


if __name__ == "__main__":
    main()

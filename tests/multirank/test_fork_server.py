"""The suite's warm rank jobs (tests/support/fork_server.py) against DeepSpeed's per-node launcher, which they stand
in for: the same probe ranks (tests/support/fork_probe.py) started both ways get the same arguments and environment,
and the jobs end alike when all ranks succeed, when one fails (the other terminated, its code the job's) and on a
SIGTERM to the job's process group (every rank terminated, exit 1)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.helpers import REPO, fork_server, free_port, launch_command, rank_env

PROBE = "tests.support.fork_probe"
PER_RUN = {"MASTER_PORT", "PWD", "OLDPWD"}  # the port each job claims; the shell's idea of the directory
START_TIMEOUT = 60


def start(how: str, out: Path, scenario: str):
    out.mkdir(parents=True)
    args, port = [str(out), scenario], free_port()
    if how == "warm":
        return fork_server().start(2, PROBE, args, port, rank_env(), REPO, out / "job.log")
    with open(out / "job.log", "ab") as log:
        return subprocess.Popen(launch_command(2, PROBE, args, port=port), cwd=REPO, env=rank_env(), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


def records(out: Path) -> dict[str, dict]:
    deadline = time.monotonic() + START_TIMEOUT
    while not all((out / f"rank{r}.json").is_file() for r in "01"):
        assert time.monotonic() < deadline, (out / "job.log").read_text()
        time.sleep(0.1)
    return {r: json.loads((out / f"rank{r}.json").read_text()) for r in "01"}


def outcome(job, out: Path, scenario: str) -> dict:
    seen = records(out)
    if scenario == "wait":
        os.killpg(job.pid, signal.SIGTERM)
    code = job.wait(timeout=60)
    return {"exit": code, "terminated": sorted(p.name for p in out.glob("*.terminated")), "ranks": seen,
            "pgid": {r: seen[r]["pgid"] == job.pid and seen[r]["ppid"] == job.pid for r in seen}}


@pytest.mark.parametrize("scenario", ["ok", "fail", "wait"])
def test_a_warm_job_is_what_deepspeeds_launcher_makes_of_the_same_ranks(tmp_path, scenario):
    results = {how: outcome(start(how, tmp_path / how, scenario), tmp_path / how, scenario)
               for how in ("launcher", "warm")}
    launcher, warm = results["launcher"], results["warm"]
    assert warm["exit"] == launcher["exit"] == {"ok": 0, "fail": 3, "wait": 1}[scenario]
    assert warm["terminated"] == launcher["terminated"] == {"ok": [], "fail": ["rank0.terminated"],
                                                             "wait": ["rank0.terminated", "rank1.terminated"]}[scenario]
    assert warm["pgid"] == launcher["pgid"] == {"0": True, "1": True}  # children of the job, in its process group
    for rank in "01":
        ours, theirs = warm["ranks"][rank], launcher["ranks"][rank]
        assert ours["argv"][0] == theirs["argv"][0] == f"--local_rank={rank}"
        assert ours["argv"][1:] == [str(tmp_path / "warm"), scenario]
        differing = {k for k in ours["env"].keys() | theirs["env"].keys() if ours["env"].get(k) != theirs["env"].get(k)}
        assert differing <= PER_RUN, {k: (ours["env"].get(k), theirs["env"].get(k)) for k in differing - PER_RUN}
        assert ours["env"]["RANK"] == ours["env"]["LOCAL_RANK"] == rank and ours["env"]["WORLD_SIZE"] == "2"

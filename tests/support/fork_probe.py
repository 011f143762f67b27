"""TEST-ONLY: a rank that records what its launcher gave it (tests/multirank/test_fork_server.py).

    python -m tests.support.fork_probe --local_rank=R OUT SCENARIO

Writes OUT/rank<RANK>.json (argv, environment, parent pid, process group) then, by SCENARIO: `ok` exits 0; `fail`
rank 1 exits 3 while rank 0 waits; `wait` every rank waits. A waiting rank ends on SIGTERM with 143, after adding
OUT/rank<RANK>.terminated.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

WAIT_SECONDS = 120


def main(argv: list[str]) -> int:
    out, scenario = Path(argv[1]), argv[2]
    rank = os.environ["RANK"]

    def terminated(signum, frame):
        (out / f"rank{rank}.terminated").write_text(str(signum))
        os._exit(143)

    signal.signal(signal.SIGTERM, terminated)
    record = {"argv": argv, "env": dict(os.environ), "ppid": os.getppid(), "pgid": os.getpgid(0)}
    (out / f"rank{rank}.json.tmp").write_text(json.dumps(record))
    os.replace(out / f"rank{rank}.json.tmp", out / f"rank{rank}.json")
    if scenario == "ok" or (scenario == "fail" and rank == "1"):
        return 0 if scenario == "ok" else 3
    time.sleep(WAIT_SECONDS)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

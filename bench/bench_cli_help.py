"""How long `roformer WORDS --help` takes for every subcommand: the target is 0.3 s of CPU (docs/INTERFACES.md).

    .venv/bin/python bench/bench_cli_help.py [--rounds 5]

Each command line runs `python -m launcher WORDS --help` as a fresh process --rounds times; per command the best
and median wall and CPU seconds (user + system of the child, from os.wait4), beside a bare `python -c pass` of the
same interpreter measured the same way (the floor every command pays). The load average is recorded before each
command; run it on a quiet machine. Writes bench/results/cli_help.json. The suite checks the cause instead
(tests/unit/test_cli_help.py: --help imports none of torch, DeepSpeed, transformers, matplotlib).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from launcher.cli import SUBCOMMANDS  # noqa: E402

TARGET_CPU_S = 0.3
COMMANDS = [[name] for name in SUBCOMMANDS] + [["data", "prepare"], ["data", "tokenizer"], ["data", "upload"]]


def timed(argv: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one child running argv, its output discarded."""
    start = time.perf_counter()
    pid = os.posix_spawn(argv[0], argv, {**os.environ, "PYTHONPATH": str(REPO)},
                         file_actions=[(os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                                       (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0)])
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)}: exited {os.waitstatus_to_exitcode(status)}")
    return wall, usage.ru_utime + usage.ru_stime


def measure(name: str, argv: list[str], rounds: int) -> dict:
    load = os.getloadavg()[0]
    runs = [timed(argv) for _ in range(rounds)]
    walls, cpus = [r[0] for r in runs], [r[1] for r in runs]
    return {"command": name, "best_cpu_s": round(min(cpus), 3), "median_cpu_s": round(statistics.median(cpus), 3),
            "best_wall_s": round(min(walls), 3), "median_wall_s": round(statistics.median(walls), 3),
            "load_before": round(load, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "cli_help.json")
    args = parser.parse_args()
    python = sys.executable
    floor = measure("python -c pass", [python, "-c", "pass"], args.rounds)
    rows = [measure(f"roformer {' '.join(words)} --help", [python, "-m", "launcher", *words, "--help"], args.rounds)
            for words in COMMANDS]
    for row in [floor, *rows]:
        print(f"{row['command']:<40} CPU best {row['best_cpu_s']:.3f} s, median {row['median_cpu_s']:.3f} s; "
              f"wall median {row['median_wall_s']:.3f} s (load {row['load_before']})")
    worst = max(row["median_cpu_s"] for row in rows)
    result = {"what": "CPU and wall seconds of every subcommand's --help, fresh processes",
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
              "rounds": args.rounds, "target_cpu_s": TARGET_CPU_S,
              "summary": {"worst_median_cpu_s": worst, "meets_target": worst < TARGET_CPU_S,
                          "bare_interpreter_median_cpu_s": floor["median_cpu_s"]},
              "floor": floor, "commands": rows}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"worst median CPU {worst:.3f} s (target {TARGET_CPU_S} s): {args.out}")


if __name__ == "__main__":
    main()

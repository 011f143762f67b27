"""Training timings of a run config on this machine: step time per stage, stage switch, checkpoint
save, start-up, and resume (checkpoint load) after a SIGTERM stop.

    DS_ACCELERATOR=cpu .venv/bin/python bench/bench_training.py --config configs/demo_cpu.yaml \
        --ranks 2 --stop-at-step 100 [--set section.key=value ...]

Runs DeepSpeed's per-node launcher directly (its own process group), stops it with SIGTERM once
metrics.jsonl reaches --stop-at-step (the ranks checkpoint and exit), re-runs the same command to
resume, and writes bench/results/training_<config>.json. Numbers depend on the machine's load,
which is recorded alongside.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from launcher.train.metrics import read_metrics  # noqa: E402
from tests.support.helpers import launch_command, rank_env  # noqa: E402


def start(args, run_dir: Path, log) -> subprocess.Popen:
    extra = [item for pair in (("--set", s) for s in args.overrides) for item in pair]
    cmd = launch_command(args.ranks, "launcher.train.rank_entry",
                         ["--config", str(args.config), "--run-dir", str(run_dir), *extra])
    return subprocess.Popen(cmd, cwd=REPO, env=rank_env(), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def wait_for_step(proc: subprocess.Popen, run_dir: Path, step: int) -> None:
    while proc.poll() is None:
        if any(r["step"] >= step for r in read_metrics(run_dir, "train")):
            return
        time.sleep(0.5)


def summarise(run_dir: Path, wall: list[float]) -> dict:
    train, events = read_metrics(run_dir, "train"), read_metrics(run_dir, "event")
    per_stage = {}
    for stage in sorted({r["stage"] for r in train}):
        times = [r["step_time_s"] for r in train if r["stage"] == stage]
        first = next(r for r in train if r["stage"] == stage)
        per_stage[stage] = {"max_seq_len": first["max_seq_len"], "global_batch_size": first["global_batch_size"],
                            "steps": len(times), "median_step_s": statistics.median(times),
                            "first_step_s": times[0],
                            "median_tokens_per_s": statistics.median(r["tokens_per_s"] for r in train
                                                                     if r["stage"] == stage)}
    pick = lambda name: [e for e in events if e["event"] == name]  # noqa: E731
    return {
        "steps": len(train), "final_loss": train[-1]["loss"], "first_loss": train[0]["loss"],
        "stages": per_stage,
        "stage_switch_s": [e["seconds"] for e in pick("stage_start")],
        "checkpoint_save_s": [e["seconds"] for e in pick("checkpoint")],
        "startup_s": [e["seconds"] for e in pick("startup")],
        "startup_phases": [e.get("phases") for e in pick("startup")],
        "resume_load_s": [e["seconds"] for e in pick("resume")],
        "process_wall_s": wall,
        "validation_s": [v["seconds"] for v in read_metrics(run_dir, "valid")],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO / "configs/demo_cpu.yaml")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--stop-at-step", type=int, default=100, help="SIGTERM once this step is logged (0: never)")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--run-dir", type=Path, default=REPO / "runs/bench-training")
    args = parser.parse_args()
    shutil.rmtree(args.run_dir, ignore_errors=True)
    args.run_dir.parent.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    wall = []
    with open(args.run_dir.parent / f"{args.run_dir.name}.log", "wb") as log:
        t0 = time.time()
        proc = start(args, args.run_dir, log)
        if args.stop_at_step:
            wait_for_step(proc, args.run_dir, args.stop_at_step)
            os.kill(proc.pid, signal.SIGTERM)  # the per-node launcher; it forwards to the ranks
        proc.wait()
        wall.append(time.time() - t0)
        if args.stop_at_step:
            t0 = time.time()
            proc = start(args, args.run_dir, log)
            rc = proc.wait()
            wall.append(time.time() - t0)
            if rc != 0:
                print(f"resumed run failed (rc {rc}); see {log.name}", file=sys.stderr)
                return 1
    result = {"config": str(args.config), "ranks": args.ranks, "overrides": args.overrides,
              "load_average_before": load_before, "load_average_after": os.getloadavg(),
              "cpus": len(os.sched_getaffinity(0)), **summarise(args.run_dir, wall)}
    out = REPO / "bench/results" / f"training_{args.config.stem}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

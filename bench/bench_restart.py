"""Time lost per fault with `roformer pretrain --max-restarts` (issue 20): detection + restart + redone steps,
for a tiny config and for configs/demo_cpu.yaml, and the checkpoint save time that bounds the redone part.

    DS_ACCELERATOR=cpu .venv/bin/python bench/bench_restart.py [--configs tiny,demo] [--kill-after 5]

Each config runs as the real command on this machine (2 local ranks, `roformer pretrain --num_gpus 2
--max-restarts 1 --set restarts.backoff_seconds=0`) through the test rank entry
(tests/support/rank_wrapper.py), whose ROFORMER_TEST_SIGKILL_ONCE_AT makes rank 1 SIGKILL itself once,
`--kill-after` steps after a checkpoint, and notes when. Once the restarted job has trained the lost steps
again the bench stops it with SIGTERM (the rest of the schedule measures nothing). From RUN_DIR/restarts.json
(launcher/run_dir/restart_records.py) and metrics.jsonl:
- detection: the kill -> `roformer pretrain` seeing the failure (the guard's line),
- stop: -> every process of the job ended (the others get up to 30 s to end by themselves),
- restart: the new launch -> the end of its first step (start-up, rendezvous, engine, checkpoint load),
- redo: the lost steps' time as first trained (bounded by checkpoint.every_steps x the step time),
- checkpoint save: the median `checkpoint` event, what each checkpoint costs (so what a shorter interval,
  i.e. fewer steps to redo, costs).
Goal (issue 20): detection + stop + restart under 60 s on CPU for the demo config. Results, with the load
average before and after each run: bench/results/restart.json. The demo config needs runs/demo-data
(made here as scripts/demo.sh makes it, when missing).
"""
from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
RESULTS = REPO / "bench" / "results" / "restart.json"
DEMO = REPO / "configs" / "demo_cpu.yaml"
DEMO_DATA = REPO / "runs" / "demo-data"
GOAL_SECONDS = 60.0


def prepare_demo_data() -> None:
    if (DEMO_DATA / "manifest.json").is_file():
        return
    subprocess.run([sys.executable, "-m", "launcher", "data", "prepare", "--default-corpus", "en", "--out",
                    str(DEMO_DATA), "--vocab-size", "8000", "--workers", "2"], cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL)


def tiny_config(root: Path) -> tuple[Path, int]:
    """The tests' tiny model and schedule (16 steps, a checkpoint every 4) on the demo's corpus."""
    from tests.support.helpers import TINY_MODEL, tiny_run_config

    config = tiny_run_config(root, DEMO_DATA, model={**TINY_MODEL, "vocab_size": 8000})
    return config, 4


def run_one(name: str, config: Path, every: int, kill_after: int, work: Path) -> dict:
    from launcher.run_dir.layout import RunDir
    from launcher.run_dir.restart_records import read_restarts
    from launcher.train.metrics import read_metrics
    from tests.support.helpers import free_port, roformer_env

    run_dir = work / f"run-{name}"
    kill_step = every + kill_after  # steps completed when rank 1 kills itself (the newest checkpoint: `every`)
    env = roformer_env(ROFORMER_TEST_SIGKILL_ONCE_AT=f"1:{kill_step}", OMP_NUM_THREADS="1")
    load_before = os.getloadavg()
    log = work / f"{name}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "launcher", "pretrain", "--num_gpus", "2", "--master_port", str(free_port()),
             "--config", str(config), "--run-dir", str(run_dir), "--entry-module", "tests.support.rank_wrapper",
             "--max-restarts", "1", "--set", "restarts.backoff_seconds=0"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 3600
        while time.monotonic() < deadline and proc.poll() is None:
            records = read_restarts(RunDir(run_dir))
            trained = [r["step"] for r in read_metrics(run_dir, "train")]
            # The restart took its first step, and trained the lost steps again (a resumed rank 0 first drops
            # the lines past its checkpoint from metrics.jsonl).
            if records and records[0].seconds_lost is not None and max(trained, default=0) >= kill_step:
                break
            time.sleep(1)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # the ranks checkpoint and stop: the rest measures nothing
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    [record] = read_restarts(RunDir(run_dir))
    killed_at = float((run_dir / f"test-fault-1-{kill_step}").read_text())
    detection = record.unix_time - killed_at
    saves = [e["seconds"] for e in read_metrics(run_dir, "event") if e.get("event") == "checkpoint"]
    steps = [r["step_time_s"] for r in read_metrics(run_dir, "train")]
    result = {
        "config": name, "failed_at_step": record.failed_at_step, "resumed_from_step": record.restarted_from_step,
        "steps_lost": record.steps_lost, "detection_s": round(detection, 2), "stop_s": record.stop_seconds,
        "backoff_s": record.backoff_seconds, "restart_s": record.restart_seconds, "redo_s": record.redo_seconds,
        "detection_plus_restart_s": round(detection + record.stop_seconds + record.backoff_seconds
                                          + record.restart_seconds, 2),
        "seconds_lost": round(detection + record.seconds_lost, 2),
        "checkpoint_save_s_median": round(statistics.median(saves), 3) if saves else None,
        "checkpoints_saved": len(saves), "checkpoint_every_steps": every,
        "step_time_s_median": round(statistics.median(steps), 3),
        "redo_bound_s": round(every * statistics.median(steps), 2),
        "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()],
    }
    print(f"{name}: detection {result['detection_s']} s + stop {result['stop_s']} s + restart {result['restart_s']} s "
          f"= {result['detection_plus_restart_s']} s; redo {result['redo_s']} s ({result['steps_lost']} steps); "
          f"checkpoint save {result['checkpoint_save_s_median']} s; load {result['load_before'][0]} -> "
          f"{result['load_after'][0]}", flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="tiny,demo", help="which of tiny,demo (default both)")
    parser.add_argument("--kill-after", type=int, default=5, help="steps after a checkpoint the rank is killed")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from launcher.common.io import atomic_write_json

    prepare_demo_data()
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-restart-") as tmp:
        work = Path(tmp)
        for name in args.configs.split(","):
            if name == "tiny":
                config, every = tiny_config(work / "tiny-config")
                runs.append(run_one("tiny", config, every, min(args.kill_after, every - 1), work))
            elif name == "demo":
                from launcher.config.run_config import load_run_config

                runs.append(run_one("demo", DEMO, load_run_config(DEMO).checkpoint.every_steps, args.kill_after, work))
            else:
                parser.error(f"--configs: unknown {name!r} (tiny, demo)")
    demo = next((r for r in runs if r["config"] == "demo"), None)
    payload = {"bench": "restart", "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
               "ranks": 2, "goal": f"detection + stop + restart < {GOAL_SECONDS:g} s on CPU for the demo config",
               "goal_met": None if demo is None else demo["detection_plus_restart_s"] < GOAL_SECONDS,
               "runs": runs, "written": time.strftime("%Y-%m-%d %H:%M:%S")}
    atomic_write_json(Path(args.out), payload)
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

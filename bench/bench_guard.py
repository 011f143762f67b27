"""The numerics guard's cost per step and the time lost per rewind (issue 29).

    DS_ACCELERATOR=cpu .venv/bin/python bench/bench_guard.py [--rounds 40] [--config demo|tiny]

1. Cost per step, side by side in one process: rank 0 of a real 1-rank run (`launcher.train.rank.start`,
   the config's model and first stage, checkpoints and validation off) driven by `Trainer.step`, its
   steps alternating between guard.action `off` and `warn` round-robin (the machine is shared; the
   load average is recorded). Reported: the median step with the guard on and off, and the median time
   inside the guard itself (`GuardActions.after_step`: building the step's figures and the detector's
   rules), as a share of the step. Goal: below 1% of the step.
2. Time lost per rewind: the real command (`roformer pretrain --num_gpus 2`, through the test rank entry
   tests/support/rank_wrapper.py) with a poisoned stretch of `--poison-steps` global batches right after a
   checkpoint (ROFORMER_TEST_POISON_SEQUENCES), the guard's defaults and action `rewind`. From the `guard`
   event of metrics.jsonl: the in-process rewind itself (agree on the checkpoint, load weights, optimizer,
   loss scaler, counters, data position and RNG, skip, rewrite metrics.jsonl / TensorBoard), plus the
   steps trained from the checkpoint to the trigger, which the rewind throws away (at the median step time).
Results, with the load average before and after: bench/results/guard.json. `--config demo` is the demo's
model and first stage (configs/demo_cpu.yaml) on runs/demo-data (prepared as scripts/demo.sh does, when
missing); `--config tiny` is the tests' tiny model on the same corpus (to check the script quickly).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
RESULTS = REPO / "bench" / "results" / "guard.json"
GOAL_SHARE = 0.01


def run_config(root: Path, kind: str, data_dir: Path, steps: int, every: int) -> Path:
    """One stage of `steps` steps: the demo's model and first stage, or the tests' tiny model."""
    import yaml

    from tests.support.helpers import TINY_MODEL, tiny_run_config

    if kind == "demo":
        demo = yaml.safe_load((REPO / "configs" / "demo_cpu.yaml").read_text())
        first = yaml.safe_load((REPO / "launcher" / "schedules" / "tiny_cpu.yaml").read_text())["stages"][0]
        model, optimizer = demo["model"], demo["optimizer"]
        stage = {**first, "steps": steps}
        tokens = demo["schedule"]["max_tokens_per_micro_batch"]
    else:
        model, optimizer = {**TINY_MODEL, "vocab_size": 8000}, {"lr": 2e-3, "warmup_steps": 3}
        stage = {"name": "tiny", "max_seq_len": 32, "global_batch_size": 8, "steps": steps}
        tokens = 256
    return tiny_run_config(root, data_dir, name=f"{kind}.yaml", stages=[stage], model=model, optimizer=optimizer,
                           schedule={"max_tokens_per_micro_batch": tokens},
                           checkpoint={"every_steps": every, "keep_last": 3},
                           logging={"valid_every": 0, "progress_bar": False, "plots": False})


def cost_per_step(config: Path, run_dir: Path, rounds: int) -> dict:
    """Steps alternating guard off / on in one trainer; medians of the wall time of each and of the guard."""
    from bench_overhead import PartTimer, start_trainer

    started, stage = start_trainer(config, run_dir)
    trainer = started.trainer
    guard_cfg = trainer.cfg.guard
    timer = PartTimer()
    timer.wrap(trainer.guard, "after_step", "guard")
    for _ in range(3):  # warm-up: allocator, optimizer state, DeepSpeed buckets
        trainer.step(stage)
    timer.take()
    samples: dict[str, list[float]] = {"off_s": [], "on_s": [], "guard_s": [], "load_1min": []}
    for index in range(rounds):
        for action in (("off", "warn") if index % 2 == 0 else ("warn", "off")):  # neither always goes first
            guard_cfg.action = action
            wall = time.perf_counter()
            trainer.step(stage)
            spent = time.perf_counter() - wall
            samples["on_s" if action == "warn" else "off_s"].append(spent)
            guard = timer.take().get("guard", 0.0)
            if action == "warn":
                samples["guard_s"].append(guard)
        samples["load_1min"].append(os.getloadavg()[0])
    started.metrics.close()
    median = {key: statistics.median(values) for key, values in samples.items()}
    return {
        "step_s_guard_off": median["off_s"], "step_s_guard_on": median["on_s"],
        "on_minus_off_share": (median["on_s"] - median["off_s"]) / median["off_s"],
        "guard_s_per_step": median["guard_s"], "guard_share_of_step": median["guard_s"] / median["on_s"],
        "meets_goal": median["guard_s"] / median["on_s"] < GOAL_SHARE,
        "rounds": rounds, "samples": samples,
    }


def poisoned_checkpoint(every: int, warmup_steps: int, min_window: int) -> int:
    """The first checkpoint step after which the guard's spike rules judge (warmup over, min_window values in)."""
    return -(-(warmup_steps + min_window + 1) // every) * every


def time_per_rewind(config: Path, work: Path, every: int, poison_steps: int) -> dict:
    """A 2-rank job whose data is poisoned for `poison_steps` steps right after the first checkpoint at which
    the guard's default rules are armed."""
    from launcher.config.run_config import load_run_config
    from launcher.train.metrics import read_metrics
    from tests.support.helpers import free_port, roformer_env

    cfg = load_run_config(config)
    stage = cfg.schedule.stages[0]
    first_poisoned = poisoned_checkpoint(every, cfg.optimizer.warmup_steps, cfg.guard.min_window) * stage.global_batch_size
    run_dir = work / "rewind-run"
    env = roformer_env(ROFORMER_TEST_POISON_SEQUENCES=f"{first_poisoned}:{poison_steps * stage.global_batch_size}",
                       OMP_NUM_THREADS="1")
    load_before = os.getloadavg()
    proc = subprocess.run([sys.executable, "-m", "launcher", "pretrain", "--num_gpus", "2", "--master_port",
                           str(free_port()), "--config", str(config), "--run-dir", str(run_dir), "--entry-module",
                           "tests.support.rank_wrapper", "--guard", "rewind"],
                          cwd=REPO, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=3600)
    events = [e for e in read_metrics(run_dir, "event") if e.get("event") == "guard"]
    step_times = [r["step_time_s"] for r in read_metrics(run_dir, "train")]
    rewinds = [e for e in events if e.get("action") == "rewind"]
    if not rewinds:
        raise SystemExit(f"no rewind happened (exit code {proc.returncode}; guard events {events}):\n"
                         f"{(proc.stdout + proc.stderr)[-3000:]}")
    rewind = rewinds[0]
    step_time = statistics.median(step_times)
    redo = (rewind["step"] - rewind["to_step"]) * step_time
    return {
        "exit_code": proc.returncode, "trigger": rewind["message"],
        "rewind_seconds": rewind["seconds"], "steps_thrown_away": rewind["step"] - rewind["to_step"],
        "median_step_s": step_time, "redo_seconds": redo, "seconds_lost": rewind["seconds"] + redo,
        "rewind_in_steps": rewind["seconds"] / step_time, "checkpoint_every_steps": every,
        "poisoned_steps": poison_steps, "load_average_before": load_before, "load_average_after": os.getloadavg(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=("demo", "tiny"), default="demo")
    parser.add_argument("--rounds", type=int, default=40, help="steps with the guard on (and as many off)")
    parser.add_argument("--every", type=int, default=30, help="checkpoint.every_steps of the rewind run")
    parser.add_argument("--poison-steps", type=int, default=4, help="global batches poisoned after a checkpoint")
    parser.add_argument("--data-dir", type=Path, help="a corpus prepared with the demo's 8k tokenizer "
                                                          "(default: runs/demo-data, prepared when missing)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    from bench_restart import DEMO_DATA, prepare_demo_data

    if args.data_dir is None:
        prepare_demo_data()
    data_dir = args.data_dir or DEMO_DATA
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-guard-") as tmp:
        work = Path(tmp)
        # The rewind run: the poison after the first checkpoint at which the default rules are armed.
        warmup = 40 if args.config == "demo" else 3
        rewind_steps = poisoned_checkpoint(args.every, warmup, 50) + args.every + 2 * args.poison_steps
        rewind = time_per_rewind(run_config(work / "rewind", args.config, data_dir, rewind_steps, args.every),
                                 work, args.every, args.poison_steps)
        cost = cost_per_step(run_config(work / "cost", args.config, data_dir, 2 * args.rounds + 10, 0),
                             work / "cost-run", args.rounds)
    import deepspeed
    import torch

    from launcher.common.io import atomic_write_json

    result = {"goal": f"the guard's own time below {GOAL_SHARE:.0%} of a step", "config": args.config,
              "cost_per_step": cost, "rewind": rewind,
              "environment": {"torch": torch.__version__, "deepspeed": deepspeed.__version__,
                              "cpu_count": os.cpu_count(), "machine": platform.machine(),
                              "load_average_start": load_before, "load_average_end": os.getloadavg(),
                              "measured_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}}
    atomic_write_json(args.out, result)
    print(json.dumps({"guard_share_of_step": cost["guard_share_of_step"], "guard_s_per_step": cost["guard_s_per_step"],
                      "on_minus_off_share": cost["on_minus_off_share"], "rewind_seconds": rewind["rewind_seconds"],
                      "seconds_lost_per_rewind": rewind["seconds_lost"]}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

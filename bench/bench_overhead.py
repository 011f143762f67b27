"""Framework overhead: the real trainer's tokens/s against the bare model step, side by side in one process.

    DS_ACCELERATOR=cpu .venv/bin/python bench/bench_overhead.py [--rounds 10] [--batch-size 16 --seq-len 512]

- bare: our RoFormerForMaskedLM in plain torch: zero_grad, forward with the masked-only loss,
  backward, gradient clipping at the DeepSpeed config's value, torch AdamW with the DeepSpeed
  config's settings and the trainer's parameter groups; one fixed batch from the same corpus.
- trainer: rank 0 of a real 1-rank run, started by `launcher.train.rank.check_inputs` and `start` (run-config
  and data checks, the prepared corpus through the data pipeline, the DeepSpeed engine of
  ds_configs/cpu_fp32_zero2.json (ZeRO-2, fp32, torch AdamW), metrics.jsonl + TensorBoard +
  progress lines, watchdog heartbeats), driven by `Trainer.step`: the learning rate, the batch built
  by the data pipeline, the step's all-reduce, the engine's forward / backward / step, the train
  record. Checkpoints and validation are off (neither is part of a step).
Both at the same model shape (the issue's: h256 / L4 / H4 / I1024, vocab 30k, dropout 0.1 / 0.1)
and batch, 2 threads, fp32. Steps alternate round-robin (the machine is shared; the load average is
recorded) and each figure is the median over --rounds. The corpus is prepared on the fly (about
5 s) from the bundled English corpus with a 30k-piece tokenizer, so the vocabulary is the issue's.
The parts of each step are timed too (wrappers on the instances' methods), to show where the
difference goes. Results: bench/results/overhead.json.
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
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
RESULTS = REPO / "bench" / "results" / "overhead.json"
DS_CONFIG = REPO / "ds_configs" / "cpu_fp32_zero2.json"
MODEL = dict(vocab_size=30000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
             hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
GOAL = 0.9


def prepare_corpus(out: Path, vocab_size: int) -> None:
    """A small real corpus (SentencePiece BPE, shards) from the bundled English text."""
    subprocess.run([sys.executable, "-m", "launcher", "data", "prepare", "--default-corpus", "en",
                    "--max-documents", "800", "--vocab-size", str(vocab_size), "--out", str(out)],
                   cwd=REPO, check=True, stdout=subprocess.DEVNULL)


def write_run_config(root: Path, data_dir: Path, batch_size: int, seq_len: int, steps: int) -> Path:
    """One stage of `steps` steps at batch_size x seq_len, validation and checkpoints off."""
    from tests.support.helpers import tiny_run_config

    stage = {"name": "bench", "max_seq_len": seq_len, "global_batch_size": batch_size,
             "micro_batch_size": batch_size, "steps": steps}
    return tiny_run_config(root, data_dir, ds_config=DS_CONFIG.name, stages=[stage], seed=42, model=MODEL,
                           optimizer={"lr": 1e-4, "warmup_steps": 10}, checkpoint={"every_steps": 0},
                           logging={"log_every": 1, "valid_every": 0, "progress_bar": True, "progress_every": 1})


class PartTimer:
    """Wall seconds spent in wrapped methods, per part name, since the last `take`."""

    def __init__(self):
        self.spent: dict[str, float] = {}

    def wrap(self, owner, method: str, part: str) -> None:
        original = getattr(owner, method)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.spent[part] = self.spent.get(part, 0.0) + time.perf_counter() - start
        setattr(owner, method, timed)  # an instance attribute: only this object is affected

    @contextmanager
    def part(self, name: str):
        start = time.perf_counter()
        yield
        self.spent[name] = self.spent.get(name, 0.0) + time.perf_counter() - start

    def take(self) -> dict[str, float]:
        spent, self.spent = self.spent, {}
        return spent


def start_trainer(config: Path, run_dir: Path):
    """Rank 0 of a 1-rank run in this process, ready for its first step (the real start-up path)."""
    from tests.support.helpers import free_port

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(free_port()))
    from launcher.train import rank

    # The rank entry's steps without its lock: the run directory is this benchmark's own.
    timer = rank.PhaseTimer(time.time())
    run_dir.mkdir(parents=True, exist_ok=True)
    started = rank.start(rank.check_inputs(["--config", str(config), "--run-dir", str(run_dir)]), timer)
    trainer = started.trainer
    stage = trainer.switch_to(trainer.stages[0])
    return started, stage


def bare_step(cfg, engine, batch: dict, timer: PartTimer) -> Callable[[], None]:
    """The model step in plain torch, with the engine's weights, optimizer settings and clipping."""
    import torch

    from roformer import RoFormerForMaskedLM

    model = RoFormerForMaskedLM(cfg.model).train()
    model.load_state_dict(engine.module.state_dict())
    ds = json.loads(DS_CONFIG.read_text())
    settings = {k: v for k, v in ds["optimizer"]["params"].items() if k != "torch_adam"}
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}], lr=1e-4,
                                  **settings)
    clip = float(ds.get("gradient_clipping", 0.0))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with timer.part("forward"):
            loss = model(**batch).loss
        with timer.part("backward"):
            loss.backward()
        with timer.part("optimizer step (clip + AdamW)"):
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
    return step


def run(args, root: Path) -> dict:
    import torch

    data_dir = args.data_dir or root / "data"
    if args.data_dir is None:
        prepare_corpus(data_dir, MODEL["vocab_size"])
    config = write_run_config(root, data_dir, args.batch_size, args.seq_len, steps=args.rounds + 10)
    started, stage = start_trainer(config, root / "run")
    torch.set_num_threads(args.threads)
    trainer = started.trainer
    engine = trainer.engine
    batch = next(trainer.valid_batches.iter_eval_batches(args.seq_len, args.batch_size))  # leaves state alone
    timers = {"trainer": PartTimer(), "bare": PartTimer()}
    wrap = timers["trainer"].wrap
    wrap(trainer.batches, "next_batch", "batch building (data pipeline)")
    wrap(engine, "forward", "forward")
    wrap(engine, "backward", "backward")
    wrap(engine, "step", "optimizer step (DeepSpeed)")
    wrap(trainer.metrics, "train_step", "metrics (jsonl, TensorBoard, progress)")
    steps = {"trainer": lambda: trainer.step(stage), "bare": bare_step(trainer.cfg, engine, batch, timers["bare"])}

    for _ in range(2):  # warm-up: allocator, oneDNN primitives, optimizer state, DeepSpeed buckets
        for step in steps.values():
            step()
    for timer in timers.values():
        timer.take()
    samples: dict[str, list] = {"load_1min": []}
    parts: dict[str, list[dict]] = {name: [] for name in steps}
    for name in steps:
        samples[f"{name}_wall_s"], samples[f"{name}_cpu_s"] = [], []
    for index in range(args.rounds):
        order = list(steps) if index % 2 == 0 else list(reversed(steps))  # neither always goes first
        for name in order:
            wall, cpu = time.perf_counter(), time.process_time()
            steps[name]()
            samples[f"{name}_wall_s"].append(time.perf_counter() - wall)
            samples[f"{name}_cpu_s"].append(time.process_time() - cpu)
            parts[name].append(timers[name].take())
        samples["load_1min"].append(os.getloadavg()[0])
    started.metrics.close()

    median = {key: statistics.median(values) for key, values in samples.items()}
    tokens = args.batch_size * args.seq_len
    speeds = {name: tokens / median[f"{name}_wall_s"] for name in steps}
    breakdown = {}
    for name, rounds in parts.items():
        keys = sorted({key for spent in rounds for key in spent})
        table = {key: statistics.median(spent.get(key, 0.0) for spent in rounds) for key in keys}
        table["rest of the step"] = statistics.median(
            wall - sum(spent.values()) for wall, spent in zip(samples[f"{name}_wall_s"], rounds))
        breakdown[name] = {key: round(value, 4) for key, value in table.items()}
    ratio = speeds["trainer"] / speeds["bare"]
    paired = [b / t for b, t in zip(samples["bare_wall_s"], samples["trainer_wall_s"])]
    return {
        "goal": f"trainer tokens/s >= {GOAL:.0%} of the bare model step's",
        "trainer_over_bare": ratio,
        "trainer_over_bare_cpu_time": median["bare_cpu_s"] / median["trainer_cpu_s"],
        "trainer_over_bare_paired_median": statistics.median(paired),
        "meets_goal": ratio >= GOAL,
        "tokens_per_s": speeds,
        "shape": {**MODEL, "batch_size": args.batch_size, "seq_len": args.seq_len, "tokens_per_step": tokens,
                  "note": "the issue's shape" if (args.batch_size, args.seq_len) == (16, 512) else
                  "smaller than the issue's 16 x 512"},
        "trainer_setup": {"world_size": 1, "deepspeed_config": str(DS_CONFIG.relative_to(REPO)),
                          "precision": "fp32", "zero_stage": 2, "metrics": "metrics.jsonl + TensorBoard every step, "
                          "a progress line every step", "checkpoints": "off", "validation": "off",
                          "heartbeats": trainer.heartbeats.enabled},
        "bare_setup": "plain torch: forward (masked-only loss), backward, clip_grad_norm_ at the DeepSpeed "
                      "config's gradient_clipping, torch AdamW with its settings; one fixed batch",
        "seconds_by_part_median": breakdown,
        "medians": median,
        "samples": samples,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--data-dir", type=Path, help="a prepared corpus with a 30k tokenizer (default: prepare one)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))  # what a 1-rank run on this machine gets
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        result = run(args, Path(tmp))
    from launcher.common.io import atomic_write_json
    import deepspeed
    import torch

    result["environment"] = {
        "torch": torch.__version__, "deepspeed": deepspeed.__version__, "threads": args.threads,
        "cpu_count": os.cpu_count(), "machine": platform.machine(), "rounds": args.rounds,
        "load_average_start": load_before, "load_average_end": os.getloadavg(),
        "note": "shared machine: the two steps alternate round-robin in one process, wall-time medians",
        "measured_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    atomic_write_json(args.out, result)
    print(json.dumps({key: result[key] for key in ("trainer_over_bare", "trainer_over_bare_paired_median",
                                                    "tokens_per_s", "seconds_by_part_median")}, indent=2))
    print(f"load average: {result['environment']['load_average_end']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

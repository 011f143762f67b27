"""Downstream figures of an export, next to a random-init twin (same architecture and tokenizer).

    .venv/bin/python bench/bench_downstream.py runs/demo/export --data runs/demo-data \
        [--tasks movie-reviews,inews] [--max-train-examples 2000] [--threads 1]

Writes bench/results/downstream.json: eval-mlm at the trained length and beyond, and for each task
the fine-tune report (dev/test accuracy + macro-F1, majority baseline, seconds) of the pretrained
export and of the random-init twin, so the effect of pretraining is measured, not assumed. The
inews task also runs at --max-length 128 and 512 (the long-text effect).
"""
from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from launcher.downstream.mlm_evaluation import MLMEvalConfig, evaluate_mlm  # noqa: E402
from launcher.export.export_reader import trained_max_seq_len  # noqa: E402
from launcher.downstream.fine_tuning import FinetuneConfig, finetune  # noqa: E402
from launcher.downstream.tasks import bundled_spec  # noqa: E402
from roformer import RoFormerForMaskedLM  # noqa: E402
from roformer.hf_interop import read_hf_directory, write_pretrained_files  # noqa: E402

TOKENIZER_FILES = ("spm.model", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def random_twin(export_dir: Path, out: Path, seed: int = 0) -> Path:
    config, _, _ = read_hf_directory(export_dir)
    torch.manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    write_pretrained_files(RoFormerForMaskedLM(config), out)
    for name in TOKENIZER_FILES:
        if (export_dir / name).is_file():
            shutil.copy2(export_dir / name, out / name)
    return out


def summary(report: dict) -> dict:
    return {"dev": report["dev"], "test": report["test"], "best_epoch": report["runs"][0]["best_epoch"],
            "majority_baseline_test": report["majority_baseline"]["test"], "truncated_share": report["truncated_share"],
            "train_examples": report["train_examples"], "seconds": report["seconds"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export_dir", type=Path)
    parser.add_argument("--data", type=Path, help="prepared data dir for eval-mlm (skipped when absent)")
    parser.add_argument("--tasks", default="movie-reviews,inews")
    parser.add_argument("--max-train-examples", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "downstream.json")
    args = parser.parse_args()

    results: dict = {"export": str(args.export_dir.resolve()), "machine": platform.processor() or platform.machine(),
                     "torch_threads": args.threads, "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if args.data:
        trained = trained_max_seq_len(args.export_dir) or 128
        mlm = evaluate_mlm(MLMEvalConfig(export_dir=args.export_dir, data_dir=args.data,
                                         seq_lens=[trained, 2 * trained, 4 * trained], threads=args.threads))
        results["eval_mlm"] = mlm["results"]
    with tempfile.TemporaryDirectory() as tmp:
        twin = random_twin(args.export_dir, Path(tmp) / "random_init")
        runs = [(task, 128) for task in args.tasks.split(",")]
        if "inews" in args.tasks.split(","):
            runs.append(("inews", 512))
        for task, max_length in runs:
            for label, directory in (("pretrained", args.export_dir), ("random_init", twin)):
                cfg = FinetuneConfig(export_dir=directory, task=bundled_spec(task), max_length=max_length, epochs=args.epochs,
                                     lr=args.lr, max_train_examples=args.max_train_examples, threads=args.threads,
                                     batch_size=32 if max_length <= 128 else 16)
                results.setdefault("finetune", {}).setdefault(f"{task}@{max_length}", {})[label] = summary(finetune(cfg))
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(results, indent=2) + "\n")  # partial results survive a stop
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Fine-tuning speed: `roformer finetune` against transformers' `Trainer`, same export, task and settings.

    .venv/bin/python bench/bench_finetune.py [EXPORT] [--train-examples 1024] [--rounds 3] [--threads 1]

(transformers' Trainer needs `accelerate`: `.venv/bin/pip install -e '.[bench]'`.)

Both fine-tune the same transformers-format directory on the same labelled CSV (real movie-review
sentences with word labels, written to a temporary directory from the set-up step's task files)
with the same settings: max length 128, batch 32, AdamW lr 1e-3 with 10% linear warmup and linear
decay, weight decay 0.01, gradient clipping at 1.0, dynamic padding, the export's dropout, fp32,
the same torch thread count, 2 epochs. Measured: training examples per second of the optimisation
loop alone (ours: the report's `train_examples_per_second`; transformers: wall time of
`Trainer.train()` with evaluation, saving and logging off), in alternating rounds in one process,
with the machine's load average before and after each measurement. Ours also runs its per-epoch dev
scoring and test scoring; that time is reported separately (`job_seconds`), not counted.
Without EXPORT: a random-init model of the demo's shape (configs/demo_cpu.yaml: hidden 128, 2
layers, 4 heads, FFN 512, vocabulary 8000) with the tests' stored tokenizer (speed does not depend on
the weights' values). Writes bench/results/finetune.json (goal: ours not slower).
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SETTINGS = dict(max_length=128, batch_size=32, lr=1e-3, epochs=2, warmup_ratio=0.1, weight_decay=0.01)


def demo_shaped_export(out: Path) -> Path:
    """A random-init RoFormer of the demo's shape with the stored test run's tokenizer."""
    import torch
    import yaml

    from launcher.export.exporter import export_checkpoint
    from launcher.export.sentence_transformers_files import write_sentence_transformers_files
    from roformer import RoFormerConfig, RoFormerForMaskedLM
    from roformer.hf_interop import write_pretrained_files
    from tests.support.helpers import extract_archive

    stored = out / "stored"
    extract_archive(ROOT / "tests" / "fixtures" / "old_run_dir.tar.xz", stored)
    run_dir = stored / "old_run" / "run"
    config = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
    config["data"]["data_dir"] = str(run_dir.parent / "data")
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    export = export_checkpoint(run_dir, out / "export")  # for its tokenizer files
    torch.manual_seed(0)
    model = RoFormerForMaskedLM(RoFormerConfig(vocab_size=8000, hidden_size=128, num_hidden_layers=2,
                                               num_attention_heads=4, intermediate_size=512))
    (export / "export_info.json").unlink()  # its checksums describe the stored weights, replaced here
    write_pretrained_files(model, export)
    write_sentence_transformers_files(export, model.config.hidden_size, SETTINGS["max_length"])  # the new shape
    return export


def write_task(out: Path, count: int) -> dict[str, Path]:
    from launcher.downstream.tasks import default_tasks_dir
    from tests.support.labelled_data import movie_review_rows, write_rows

    return {split: write_rows(out / f"{split}.csv", movie_review_rows(default_tasks_dir(), split, n))
            for split, n in (("train", count), ("dev", 256), ("test", 256))}


def ours(export: Path, files: dict, threads: int) -> dict:
    from launcher.downstream.fine_tuning import FinetuneConfig, finetune
    from launcher.downstream.task_spec import TaskSpec

    spec = TaskSpec(name="movie-reviews-csv", **files)
    started = time.perf_counter()
    report = finetune(FinetuneConfig(export_dir=export, task=spec, threads=threads, **SETTINGS), progress=False,
                      log=lambda msg: None)
    run = report["runs"][0]
    return {"examples_per_second": run["train_examples_per_second"], "job_seconds": round(time.perf_counter() - started, 1),
            "train_examples": run["train_examples"], "dev_accuracy": report["dev"]["accuracy"]}


def transformers_trainer(export: Path, files: dict, threads: int) -> dict:
    import datasets
    import torch
    import transformers

    torch.set_num_threads(threads)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(export))
    train = datasets.load_dataset("csv", data_files=str(files["train"]), split="train", keep_in_memory=True)
    labels = sorted(set(train["label"]))
    train = train.map(lambda batch: {**tokenizer(batch["text"], truncation=True, max_length=SETTINGS["max_length"]),
                                     "labels": [labels.index(y) for y in batch["label"]]},
                      batched=True, remove_columns=train.column_names, keep_in_memory=True)
    torch.manual_seed(0)
    model = transformers.RoFormerForSequenceClassification.from_pretrained(str(export), num_labels=len(labels))
    total_steps = math.ceil(len(train) / SETTINGS["batch_size"]) * SETTINGS["epochs"]
    with tempfile.TemporaryDirectory() as out_dir:
        args = transformers.TrainingArguments(  # warmup in steps as ours counts it (transformers 5 has no ratio)
            output_dir=out_dir, per_device_train_batch_size=SETTINGS["batch_size"], learning_rate=SETTINGS["lr"],
            num_train_epochs=SETTINGS["epochs"], warmup_steps=max(1, int(SETTINGS["warmup_ratio"] * total_steps)),
            weight_decay=SETTINGS["weight_decay"], max_grad_norm=1.0, lr_scheduler_type="linear", use_cpu=True,
            eval_strategy="no", save_strategy="no", logging_strategy="no", report_to=[], disable_tqdm=True,
            dataloader_num_workers=0, seed=0)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=train,
                                       data_collator=transformers.DataCollatorWithPadding(tokenizer))
        trainer.remove_callback(transformers.trainer_callback.PrinterCallback)  # no metrics dict on the console
        started = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - started
    return {"examples_per_second": round(len(train) * SETTINGS["epochs"] / seconds, 2), "train_examples": len(train)}


def side_by_side(sides: dict, rounds: int, export: Path, files: dict, threads: int) -> dict:
    """Each side's `measure(export, files, threads)` alternately, `rounds` times (each round's pair back to back,
    under about the same load): every round with the load around it, each side's median examples/s, and the
    paired ratios of the first side over the second."""
    measured = []
    for index in range(rounds):
        for name, measure in sides.items():
            load_before = os.getloadavg()
            result = measure(export, files, threads)
            measured.append({"round": index, "side": name, **result,
                             "load_before": [round(x, 2) for x in load_before],
                             "load_after": [round(x, 2) for x in os.getloadavg()]})
            print(f"round {index} {name}: {result['examples_per_second']:.1f} examples/s", file=sys.stderr)
    first, second = sides
    return {"rounds": measured,
            "median_examples_per_second": {side: statistics.median(r["examples_per_second"] for r in measured
                                                                    if r["side"] == side) for side in sides},
            "paired_ratios": [round(a["examples_per_second"] / b["examples_per_second"], 3)
                              for a, b in zip(measured[0::2], measured[1::2])]}


def side_by_side_args(description: str, out_name: str) -> argparse.Namespace:
    """The command line of this benchmark and bench_retrieval.py; offline Hugging Face libraries."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("export_dir", type=Path, nargs="?", default=None)
    parser.add_argument("--train-examples", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3, help="alternating measurements of each side")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / out_name)
    args = parser.parse_args()
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return args


def write_results(args: argparse.Namespace, what: str, settings: dict, versions: dict, compared: dict,
                  theirs: tuple[str, str], ratio_key: str) -> None:
    """The results file of a side-by-side run (ours against `theirs`: its side's key and its name), and its
    one summary line."""
    from launcher.common.io import atomic_write_json

    theirs, their_name = theirs
    medians = compared["median_examples_per_second"]
    results = {
        "what": what,
        "export": str(args.export_dir) if args.export_dir else "random-init, demo shape (h128 L2, vocab 8000)",
        "settings": settings,
        "machine": {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count()},
        "versions": {**versions, "torch": __import__("torch").__version__},
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        **compared,
        ratio_key: round(medians["ours"] / medians[theirs], 3),
    }
    atomic_write_json(args.out, results)
    print(f"ours {medians['ours']:.1f} vs {their_name} {medians[theirs]:.1f} examples/s (x{results[ratio_key]}); "
          f"-> {args.out}", file=sys.stderr)


def main() -> int:
    args = side_by_side_args(__doc__.splitlines()[0], "finetune.json")

    import transformers

    transformers.logging.set_verbosity_error()  # the new head's "newly initialized" notice, once per round

    with tempfile.TemporaryDirectory(prefix="bench-finetune-") as tmp:
        export = args.export_dir or demo_shaped_export(Path(tmp))
        files = write_task(Path(tmp) / "task", args.train_examples)
        compared = side_by_side({"ours": ours, "transformers_trainer": transformers_trainer}, args.rounds, export,
                                files, args.threads)
    write_results(args, "fine-tuning examples/s of the optimisation loop: roformer finetune vs transformers Trainer, "
                        "same export, task (movie-review sentences, CSV, word labels), settings and threads",
                  {**SETTINGS, "train_examples": args.train_examples, "torch_threads": args.threads},
                  {"transformers": transformers.__version__}, compared, ("transformers_trainer", "Trainer"),
                  "ours_over_transformers")
    return 0


if __name__ == "__main__":
    sys.exit(main())

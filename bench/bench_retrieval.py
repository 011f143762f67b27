"""Retrieval fine-tuning speed: `roformer finetune --task-type retrieval` against sentence-transformers'
own trainer (`SentenceTransformerTrainer`, what `model.fit` runs), same export, data and settings.

    .venv/bin/python bench/bench_retrieval.py [EXPORT] [--train-examples 1024] [--rounds 3] [--threads 1]

(sentence-transformers' trainer needs `accelerate`: `.venv/bin/pip install -e '.[bench]'`.)

Both fine-tune the same export on the same (query, passage, hard negative) rows: the bundled
`wordnet-senses` training split's first N rows, written to a temporary CSV. Same settings: max length
128, batch 32, MultipleNegativesRankingLoss (scale 20, cosine), NoDuplicatesBatchSampler, AdamW lr
1e-3 with 10% linear warmup and linear decay, weight decay 0.01, gradient clipping at 1.0, the
export's dropout, fp32, the same torch thread count, 1 epoch. Measured: training examples per second
of the optimisation loop alone (ours: the report's `train_examples_per_second`; sentence-transformers:
wall time of `trainer.train()` with evaluation, saving and logging off), in alternating rounds in one
process, with the load average before and after each measurement. Ours also scores dev zero-shot and
after the epoch; that time is in `job_seconds`, not counted. Without EXPORT: a random-init model of the
demo's shape (bench/bench_finetune.py's `demo_shaped_export`). Writes bench/results/retrieval.json
(goal: ours not slower).
"""
from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SETTINGS = dict(max_length=128, batch_size=32, lr=1e-3, epochs=1, warmup_ratio=0.1, weight_decay=0.01)


def write_task(out: Path, count: int) -> dict[str, Path]:
    """The first `count` training rows of the bundled retrieval task (and 128 dev rows) as CSV files."""
    from launcher.downstream.tasks import default_tasks_dir
    from tests.support.labelled_data import write_rows

    files = {}
    for split, n in (("train", count), ("dev", 128)):
        with (default_tasks_dir() / "wordnet-senses" / f"{split}.jsonl").open(encoding="utf-8") as f:
            rows = [json.loads(line) for _, line in zip(range(n), f)]
        files[split] = write_rows(out / f"{split}.csv", [{k: r[k] for k in ("query", "passage", "negative")}
                                                         for r in rows])
    return files


def ours(export: Path, files: dict, threads: int) -> dict:
    from launcher.downstream.fine_tuning import FinetuneConfig, finetune
    from launcher.downstream.task_spec import TaskSpec

    spec = TaskSpec(name="senses-csv", train=files["train"], dev=files["dev"], text_column="query",
                    text_pair_column="passage", negative_column="negative", task_type="retrieval")
    started = time.perf_counter()
    report = finetune(FinetuneConfig(export_dir=export, task=spec, threads=threads, **SETTINGS), progress=False,
                      log=lambda msg: None)
    run = report["runs"][0]
    return {"examples_per_second": run["train_examples_per_second"], "job_seconds": round(time.perf_counter() - started, 1),
            "train_examples": run["train_examples"], "steps": run["steps"], "dev_ndcg@10": report["dev"]["ndcg@10"]}


def sentence_transformers_trainer(export: Path, files: dict, threads: int) -> dict:
    import datasets
    import torch
    import transformers
    from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                       SentenceTransformerTrainingArguments)
    from sentence_transformers.base.sampler import BatchSamplers
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    torch.set_num_threads(threads)
    train = datasets.load_dataset("csv", data_files=str(files["train"]), split="train", keep_in_memory=True)
    train = train.rename_columns({"query": "anchor", "passage": "positive"})
    torch.manual_seed(0)
    model = SentenceTransformer(str(export), device="cpu")
    model.max_seq_length = SETTINGS["max_length"]
    total_steps = math.ceil(len(train) / SETTINGS["batch_size"]) * SETTINGS["epochs"]
    with tempfile.TemporaryDirectory() as out_dir:
        args = SentenceTransformerTrainingArguments(
            output_dir=out_dir, per_device_train_batch_size=SETTINGS["batch_size"], learning_rate=SETTINGS["lr"],
            num_train_epochs=SETTINGS["epochs"], warmup_steps=max(1, int(SETTINGS["warmup_ratio"] * total_steps)),
            weight_decay=SETTINGS["weight_decay"], max_grad_norm=1.0, lr_scheduler_type="linear", use_cpu=True,
            batch_sampler=BatchSamplers.NO_DUPLICATES, eval_strategy="no", save_strategy="no",
            logging_strategy="no", report_to=[], disable_tqdm=True, dataloader_num_workers=0, seed=0)
        trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train,
                                             loss=MultipleNegativesRankingLoss(model))
        trainer.remove_callback(transformers.trainer_callback.PrinterCallback)  # no metrics dict on the console
        started = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - started
    return {"examples_per_second": round(len(train) * SETTINGS["epochs"] / seconds, 2), "train_examples": len(train)}


def main() -> int:
    from bench.bench_finetune import demo_shaped_export, side_by_side, side_by_side_args, write_results

    args = side_by_side_args(__doc__.splitlines()[0], "retrieval.json")

    import sentence_transformers
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    with tempfile.TemporaryDirectory(prefix="bench-retrieval-") as tmp:
        export = args.export_dir or demo_shaped_export(Path(tmp))
        files = write_task(Path(tmp) / "task", args.train_examples)
        compared = side_by_side({"ours": ours, "sentence_transformers_trainer": sentence_transformers_trainer},
                                args.rounds, export, files, args.threads)
    write_results(args, "retrieval fine-tuning examples/s of the optimisation loop: roformer finetune --task-type "
                        "retrieval vs SentenceTransformerTrainer, same export, rows (wordnet-senses train: query, "
                        "passage, hard negative), loss, batch sampler, settings and threads",
                  {**SETTINGS, "train_examples": args.train_examples, "torch_threads": args.threads,
                   "loss": "MultipleNegativesRankingLoss", "batch_sampler": "NoDuplicatesBatchSampler"},
                  {"sentence_transformers": sentence_transformers.__version__,
                   "transformers": transformers.__version__},
                  compared, ("sentence_transformers_trainer", "SentenceTransformerTrainer"),
                  "ours_over_sentence_transformers")
    return 0


if __name__ == "__main__":
    sys.exit(main())

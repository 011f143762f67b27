"""`roformer finetune`: fine-tune an export on a labelled task, one or several seeds, and score it.

Consumes only an export directory: AutoTokenizer, roformer's encoder loader and a fresh head on [CLS] laid
out as transformers' RoFormerForSequenceClassification (so the saved model loads there). Plain PyTorch on
CPU. Classification (single texts or pairs) or regression; per seed the epoch with the best dev selection
metric is kept and scored on dev and test (launcher.downstream.finetune_report).
"""
from __future__ import annotations

import copy
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from launcher.downstream.task_spec import TaskSpec
from launcher.downstream.training_loop import optimizer_and_schedule, optimizer_step, training_rows
from launcher.common.errors import UserError
from data_pipeline.progress import progress_bar
from launcher.downstream.finetune_report import build_report
from launcher.downstream.labelled_files import load_task
from launcher.downstream.retrieval import run_retrieval
from launcher.downstream.task_metrics import better, check_select_metric, scores
from launcher.export.export_reader import check_export_dir, load_auto_tokenizer, load_classifier


@dataclass
class FinetuneConfig:
    """One fine-tuning job: a task, an export, the settings and the seeds."""

    export_dir: Path  # transformers-format RoFormer directory with tokenizer files
    task: TaskSpec  # files, columns, task type (launcher.downstream.task_spec)
    max_length: int = 128  # tokens per input incl. [CLS]/[SEP]; longer inputs are truncated (pairs: longest first)
    epochs: int = 3  # passes over the (possibly subsampled) training split; retrieval: 0 = zero-shot
    batch_size: int = 32  # training sequences per step
    eval_batch_size: int = 64  # sequences per forward pass when scoring dev/test
    # Peak AdamW learning rate (linear warmup, linear decay to 0). 1e-3 suits this project's small
    # CPU models (measured on the demo export); base-size models want ~5e-5..1e-4.
    lr: float = 1e-3
    warmup_ratio: float = 0.1  # share of all steps spent warming up
    weight_decay: float = 0.01  # AdamW decoupled weight decay (not on biases / LayerNorm)
    max_train_examples: int | None = None  # seeded random subset of train (None = all)
    max_eval_examples: int | None = None  # first N of dev and of test (None = all; file order is fixed)
    seeds: tuple[int, ...] = (0,)  # one fine-tune per seed: head init, dropout, subset and batch order
    # torch CPU threads; 0 = torch's default. 1 by default: this job's small matrices gain nothing
    # from a second thread, which only burns CPU time.
    threads: int = 1
    # "pretrained": the export's encoder weights; "random": its random-init twin (same architecture
    # and tokenizer, weights freshly initialised from the seed), to measure what pretraining bought.
    init: str = "pretrained"
    # Hidden and attention dropout while fine-tuning; None keeps the export's. Pretraining recipes that
    # see their data about once run without dropout, but 1000 labelled examples are memorised within
    # a few epochs without it.
    dropout: float | None = None
    select_metric: str | None = None  # dev metric choosing the epoch (None: macro_f1 / pearson / ndcg@10 by task type)
    keep_best_state: bool = field(default=False, repr=False)  # keep the best model's weights (--save-model)

    def __post_init__(self) -> None:
        self.seeds = tuple(self.seeds)
        retrieval = self.task.task_type == "retrieval"
        checks = {"max_length": (self.max_length >= 8, "an integer >= 8 ([CLS], [SEP] and some text)"),
                  "epochs": (self.epochs >= (0 if retrieval else 1),
                             ">= 0 (0: the export as it is)" if retrieval else ">= 1 (0 only for retrieval)"),
                  "batch_size": (self.batch_size >= 1, ">= 1"),
                  "eval_batch_size": (self.eval_batch_size >= 1, ">= 1"), "lr": (self.lr > 0, "> 0"),
                  "warmup_ratio": (0 <= self.warmup_ratio < 1, "in [0, 1)"),
                  "weight_decay": (self.weight_decay >= 0, ">= 0"),
                  "max_train_examples": (self.max_train_examples is None or self.max_train_examples >= 2, ">= 2"),
                  "max_eval_examples": (self.max_eval_examples is None or self.max_eval_examples >= 1, ">= 1"),
                  "threads": (self.threads >= 0, ">= 0 (0: torch's default)"),
                  "init": (self.init in INITS, f"one of {', '.join(INITS)}"),
                  "dropout": (self.dropout is None or 0 <= self.dropout < 1, "in [0, 1)"),
                  "seeds": (bool(self.seeds) and len(set(self.seeds)) == len(self.seeds), "distinct seeds")}
        bad = [name for name, (ok, _) in checks.items() if not ok]
        if bad:
            raise UserError(f"--{bad[0].replace('_', '-')}: invalid value {getattr(self, bad[0])!r}: must be "
                            f"{checks[bad[0]][1]}")


INITS = ("pretrained", "random")

_HELP = {
    "max_length": "tokens per input incl. [CLS]/[SEP]; longer texts are truncated (try 128 vs 512 on inews)",
    "epochs": "passes over the training examples; the epoch with the best dev --select-metric is kept "
              "(retrieval: 0 scores the export as it is, zero-shot)",
    "batch_size": "training sequences per step",
    "eval_batch_size": "sequences per forward pass on dev/test",
    "lr": "peak AdamW learning rate (10%% warmup, linear decay); ~5e-5..1e-4 for base-size models",
    "warmup_ratio": "share of the steps spent warming up",
    "weight_decay": "AdamW weight decay (not on biases / LayerNorm)",
    "max_train_examples": "seeded random subset of the train split (quick runs)",
    "max_eval_examples": "first N of dev and of test (their order is fixed)",
    "threads": "torch CPU threads (0 = torch's default)",
}


@dataclass
class SeedResult:
    """One seed's fine-tune: its report entry, and what --save-model / --predictions need of it."""

    report: dict
    held_out_predictions: list  # class ids or floats, in the held-out split's order
    best_state: dict | None  # the best epoch's weights (only with cfg.keep_best_state)


def finetune(cfg: FinetuneConfig, log=lambda msg: print(msg, file=sys.stderr, flush=True),
             progress: bool = True) -> dict:
    """Every seed of `cfg`; the report of launcher.downstream.finetune_report (JSON-ready)."""
    return run_finetune(cfg, log, progress)[0]


def run_finetune(cfg: FinetuneConfig, log=lambda msg: print(msg, file=sys.stderr, flush=True),
                 progress: bool = True):
    """(report, the selected seed's SeedResult (best dev value of the selection metric), the task's
    TaskData, the tokenizer, the scored dev/test splits)."""
    import torch  # here, not at import: `roformer finetune --help` must not wait for torch

    started = time.perf_counter()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if cfg.task.task_type == "retrieval":  # an embedding model, not a classifier: its own module

        report, chosen, data, evals = run_retrieval(cfg, log, progress)
        return report, chosen, data, None, evals
    # Every input is checked before the slow part starts.
    check_export_dir(cfg.export_dir)
    data = load_task(cfg.task)
    select = check_select_metric(data.task_type, cfg.select_metric)
    tokenizer = load_auto_tokenizer(cfg.export_dir)

    evals = {"dev": data.dev, **({"test": data.test} if data.test is not None else {})}
    if cfg.max_eval_examples:
        evals = {s: split.subset(list(range(min(len(split), cfg.max_eval_examples)))) for s, split in evals.items()}
    # Only the training rows some seed draws are tokenized: a 1000-label subset of a long-document
    # split is a fraction of the whole, and tokenizing (twice: full and cut) dominated small jobs.
    rows_of_seed = {seed: training_rows(len(data.train), cfg.max_train_examples, seed) for seed in cfg.seeds}
    drawn = sorted(set().union(*rows_of_seed.values()))
    encoded = {"train": _encode(tokenizer, data.train.subset(drawn), cfg.max_length),
               **{s: _encode(tokenizer, split, cfg.max_length) for s, split in evals.items()}}
    if encoded["train"]["unk_share"] > 0.05:
        log(f"finetune {data.spec.name}: warning: {encoded['train']['unk_share']:.0%} of the training tokens are "
            f"[UNK]; the tokenizer of {cfg.export_dir} does not cover this task's text")

    position = {row: i for i, row in enumerate(drawn)}
    results = [_run_seed(cfg, seed, data, _pick(encoded["train"], [position[r] for r in rows_of_seed[seed]]),
                         encoded, tokenizer, select, log, progress) for seed in cfg.seeds]
    chosen = results[0]
    for result in results[1:]:
        if better(data.task_type, select, result.report["dev"][select], chosen.report["dev"][select]):
            chosen = result
    report = build_report(cfg, data, encoded, evals, [r.report for r in results], select,
                          chosen_seed=chosen.report["seed"], seconds=time.perf_counter() - started)
    return report, chosen, data, tokenizer, evals


def _run_seed(cfg: FinetuneConfig, seed: int, data, train: dict, encoded: dict, tokenizer, select: str, log,
              progress: bool) -> SeedResult:
    """One seed's fine-tune on `train` (its encoded training rows); `encoded` holds dev (and test)."""
    import torch

    started = time.perf_counter()
    torch.manual_seed(seed)
    model = load_classifier(cfg.export_dir, data.num_labels, random_init=cfg.init == "random", dropout=cfg.dropout)
    if len(tokenizer) > model.config.vocab_size:
        raise UserError(f"{cfg.export_dir}: tokenizer has {len(tokenizer)} ids, the model only {model.config.vocab_size}")

    history, best, train_seconds = [], None, 0.0
    steps_per_epoch = math.ceil(len(train["labels"]) / cfg.batch_size)
    optimizer, scheduler = optimizer_and_schedule(model, cfg, total_steps=steps_per_epoch * cfg.epochs)
    shuffle = torch.Generator().manual_seed(seed + 1)
    name = data.spec.name + ("" if cfg.init == "pretrained" else " (random init)")
    # A bar on a terminal; plain lines (each epoch's end, at most one every 30 s between) in a file or a pipe.
    bar = progress_bar(steps_per_epoch * cfg.epochs, f"{name} seed {seed}", "step", sys.stderr, enabled=progress)
    try:
        for epoch in range(1, cfg.epochs + 1):
            epoch_started = time.perf_counter()
            train_loss = _train_epoch(model, train, tokenizer.pad_token_id, cfg.batch_size, optimizer, scheduler,
                                      shuffle, data.task_type, bar)
            train_seconds += time.perf_counter() - epoch_started
            dev = scores(data.task_type, encoded["dev"]["labels"], _predict(model, encoded["dev"], tokenizer.pad_token_id,
                         cfg.eval_batch_size, data.task_type), data.num_labels)
            history.append({"epoch": epoch, "train_loss": round(train_loss, 5), "dev": dev})
            bar.set_postfix({"epoch": f"{epoch}/{cfg.epochs}", "loss": f"{train_loss:.4f}",
                             f"dev {select}": dev[select]})
            if not progress:
                log(f"finetune {name} seed {seed}: epoch {epoch}/{cfg.epochs} train loss {train_loss:.4f} "
                    f"dev {select} {dev[select]}")
            if best is None or better(data.task_type, select, dev[select], best[1][select]):
                best = (epoch, dev, copy.deepcopy(model.state_dict()))
    finally:
        bar.close()

    best_epoch, best_dev, best_state = best
    model.load_state_dict(best_state)
    held_out = "test" if "test" in encoded else "dev"
    predictions = _predict(model, encoded[held_out], tokenizer.pad_token_id, cfg.eval_batch_size, data.task_type)
    test = scores(data.task_type, encoded["test"]["labels"], predictions, data.num_labels) if "test" in encoded else None
    report = {"seed": seed, "best_epoch": best_epoch, "dev": best_dev, "test": test, "epochs": history,
              "train_examples": len(train["labels"]), "train_labels": train["labels"],
              # the optimisation loop alone (no dev scoring): what bench/bench_finetune.py compares
              "train_examples_per_second": round(len(train["labels"]) * cfg.epochs / max(train_seconds, 1e-9), 2),
              "seconds": round(time.perf_counter() - started, 1)}
    return SeedResult(report, predictions, best_state if cfg.keep_best_state else None)


def _encode(tokenizer, split, max_length: int) -> dict:
    """Token ids of every example (pairs as `[CLS] a [SEP] b [SEP]`, truncated longest-first so both
    keep a share), how many were truncated and the share of [UNK] tokens."""
    args = (split.texts, split.pairs) if split.pairs is not None else (split.texts,)
    full = tokenizer(*args, add_special_tokens=True, truncation=False)
    cut = tokenizer(*args, add_special_tokens=True, truncation=True, max_length=max_length)
    # SentencePiece folds a run of unknown characters into ONE [UNK]: a tokenizer trained without
    # the task's script shows up here (and as short inputs), not as an error.
    unk = tokenizer.unk_token_id
    specials = 3 if split.pairs is not None else 2
    unk_count = sum(seq.count(unk) for seq in full["input_ids"]) if unk is not None else 0
    return {"input_ids": cut["input_ids"], "token_type_ids": cut.get("token_type_ids"), "labels": list(split.labels),
            "rows": list(split.rows),
            "truncated": sum(1 for a in full["input_ids"] if len(a) > max_length),
            "unk_share": unk_count / max(1, sum(len(seq) - specials for seq in full["input_ids"]))}


def _pick(data: dict, rows: list[int]) -> dict:
    return {**data, **{k: [data[k][i] for i in rows] for k in ("input_ids", "labels", "rows")},
            "token_type_ids": None if data["token_type_ids"] is None else [data["token_type_ids"][i] for i in rows]}


def _collate(data: dict, rows: list[int], pad_id: int):
    """(input_ids, attention_mask, token_type_ids or None), each (B, T), right-padded."""
    import torch

    seqs = [data["input_ids"][i] for i in rows]
    width = max(len(x) for x in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)  # (B, T)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)  # (B, T)
    types = None if data["token_type_ids"] is None else torch.zeros((len(seqs), width), dtype=torch.long)
    for row, (i, seq) in enumerate(zip(rows, seqs)):
        ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[row, : len(seq)] = 1
        if types is not None:
            types[row, : len(seq)] = torch.tensor(data["token_type_ids"][i], dtype=torch.long)
    return ids, mask, types


def _train_epoch(model, data: dict, pad_id: int, batch_size: int, optimizer, scheduler, generator, task_type: str,
                 bar) -> float:
    import torch

    model.train()
    order = torch.randperm(len(data["labels"]), generator=generator).tolist()
    label_dtype = torch.long if task_type == "classification" else torch.float32
    total, count = 0.0, 0
    for start in range(0, len(order), batch_size):
        rows = order[start: start + batch_size]
        ids, mask, types = _collate(data, rows, pad_id)
        labels = torch.tensor([data["labels"][i] for i in rows], dtype=label_dtype)
        loss = model(ids, attention_mask=mask, token_type_ids=types, labels=labels).loss
        optimizer_step(model, loss, optimizer, scheduler)
        total += float(loss.detach()) * len(rows)
        count += len(rows)
        bar.update(1)
    return total / max(1, count)


def _predict(model, data: dict, pad_id: int, batch_size: int, task_type: str) -> list:
    """Predicted class ids / scores in the split's order; batches are formed by length so padding stays small."""
    import torch

    model.eval()
    by_length = sorted(range(len(data["labels"])), key=lambda i: len(data["input_ids"][i]))
    predictions: list = [0] * len(by_length)
    with torch.no_grad():
        for start in range(0, len(by_length), batch_size):
            rows = by_length[start: start + batch_size]
            ids, mask, types = _collate(data, rows, pad_id)
            logits = model(ids, attention_mask=mask, token_type_ids=types).logits  # (B, num_labels)
            values = logits.argmax(dim=-1).tolist() if task_type == "classification" else logits[:, 0].tolist()
            for row, value in zip(rows, values):
                predictions[row] = value
    return predictions

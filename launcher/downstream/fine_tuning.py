"""`roformer finetune EXPORT --task NAME`: sequence-classification fine-tuning on a labelled task.

Consumes only an export directory (any transformers-format RoFormer directory with a tokenizer):
tokenizer via `AutoTokenizer.from_pretrained`, encoder weights via roformer's loader, a fresh
classification head on [CLS]. Plain PyTorch on CPU (no DeepSpeed). Training uses the fixed train
split (optionally a seeded subset), the epoch with the best dev macro-F1 is kept, and dev + test
accuracy / macro-F1 go to JSON next to the majority-class baseline (the most frequent train label).
`--max-length` truncates inputs (e.g. 128 vs 512 on the long `inews` documents); the report says
what share of each split was truncated.
"""
from __future__ import annotations

import copy
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from launcher.errors import UserError


@dataclass
class FinetuneConfig:
    """One fine-tuning job."""

    export_dir: Path  # transformers-format RoFormer directory with tokenizer files
    task: str  # name in launcher.downstream.tasks.TASKS
    task_data: Path | None = None  # directory holding <task>/{train,dev,test}.jsonl (default: set-up cache)
    max_length: int = 128  # tokens per input incl. [CLS]/[SEP]; longer texts are truncated
    epochs: int = 3  # passes over the (possibly subsampled) training split
    batch_size: int = 32  # training sequences per step
    eval_batch_size: int = 64  # sequences per forward pass when scoring dev/test
    # Peak AdamW learning rate (linear warmup, linear decay to 0). 1e-3 suits this project's small
    # CPU models (measured on the demo export); base-size models want ~5e-5..1e-4.
    lr: float = 1e-3
    warmup_ratio: float = 0.1  # share of all steps spent warming up
    weight_decay: float = 0.01  # AdamW decoupled weight decay (not on biases / LayerNorm)
    max_train_examples: int | None = None  # seeded random subset of train (None = all)
    max_eval_examples: int | None = None  # first N of dev and of test (None = all; file order is fixed)
    seed: int = 0  # head init, dropout, subset and batch order
    # torch CPU threads; 0 = torch's default. 1 by default: this job's small matrices gain nothing
    # from a second thread, which burned ~3x the CPU time for the same wall time in measurements here.
    threads: int = 1
    # "pretrained": the export's encoder weights; "random": its random-init twin (same architecture
    # and tokenizer, weights freshly initialised from `seed`), to measure what pretraining bought.
    init: str = "pretrained"
    # Hidden and attention dropout while fine-tuning; None keeps the export's. Pretraining recipes that
    # see their data about once run without dropout, but 1000 labelled examples are memorised within
    # a few epochs without it.
    dropout: float | None = None

    def __post_init__(self) -> None:
        from launcher.downstream.tasks import get_task

        get_task(self.task)  # unknown task -> error listing the known ones
        checks = {"max_length": self.max_length >= 8, "epochs": self.epochs >= 1, "batch_size": self.batch_size >= 1,
                  "eval_batch_size": self.eval_batch_size >= 1, "lr": self.lr > 0,
                  "warmup_ratio": 0 <= self.warmup_ratio < 1, "weight_decay": self.weight_decay >= 0,
                  "max_train_examples": self.max_train_examples is None or self.max_train_examples >= 2,
                  "max_eval_examples": self.max_eval_examples is None or self.max_eval_examples >= 1,
                  "threads": self.threads >= 0, "init": self.init in INITS,
                  "dropout": self.dropout is None or 0 <= self.dropout < 1}
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise UserError(f"--{bad[0].replace('_', '-')}: invalid value {getattr(self, bad[0])!r}")


INITS = ("pretrained", "random")

_HELP = {
    "max_length": "tokens per input incl. [CLS]/[SEP]; longer texts are truncated (try 128 vs 512 on inews)",
    "epochs": "passes over the training examples; the epoch with the best dev macro-F1 is kept",
    "batch_size": "training sequences per step",
    "eval_batch_size": "sequences per forward pass on dev/test",
    "lr": "peak AdamW learning rate (10%% warmup, linear decay); ~5e-5..1e-4 for base-size models",
    "warmup_ratio": "share of the steps spent warming up",
    "weight_decay": "AdamW weight decay (not on biases / LayerNorm)",
    "max_train_examples": "seeded random subset of the train split (quick runs)",
    "max_eval_examples": "first N of dev and of test (their order is fixed)",
    "seed": "head init, dropout, subset and batch order",
    "threads": "torch CPU threads (0 = torch's default)",
}


def finetune(cfg: FinetuneConfig, log=lambda msg: print(msg, file=sys.stderr, flush=True)) -> dict:
    from launcher.downstream.classification_metrics import majority_label, scores
    from launcher.downstream.export_reader import check_export_dir, load_auto_tokenizer, load_classifier
    from launcher.downstream.tasks import default_tasks_dir, get_task, load_split
    import torch  # here, not at import: `roformer finetune --help` must not wait for torch

    started = time.perf_counter()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    task = get_task(cfg.task)
    task_data = Path(cfg.task_data) if cfg.task_data is not None else default_tasks_dir()
    # Every input is checked before the slow part starts.
    check_export_dir(cfg.export_dir)
    splits = {split: load_split(task_data, task, split) for split in ("train", "dev", "test")}
    tokenizer = load_auto_tokenizer(cfg.export_dir)

    train = splits["train"]
    if cfg.max_train_examples is not None and cfg.max_train_examples < len(train):
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(cfg.seed)).tolist()
        train = [train[i] for i in order[: cfg.max_train_examples]]
    evals = {s: splits[s][: cfg.max_eval_examples] if cfg.max_eval_examples else splits[s] for s in ("dev", "test")}
    encoded = {"train": _encode(tokenizer, train, cfg.max_length),
               **{s: _encode(tokenizer, ex, cfg.max_length) for s, ex in evals.items()}}

    if encoded["train"]["unk_share"] > 0.05:
        log(f"finetune {task.name}: warning: {encoded['train']['unk_share']:.0%} of the training tokens are "
            f"[UNK]; the tokenizer of {cfg.export_dir} does not cover this task's text")
    torch.manual_seed(cfg.seed)
    model = load_classifier(cfg.export_dir, task.num_labels, random_init=cfg.init == "random", dropout=cfg.dropout)
    if len(tokenizer) > model.config.vocab_size:
        raise UserError(f"{cfg.export_dir}: tokenizer has {len(tokenizer)} ids, the model only {model.config.vocab_size}")

    history, best = [], None
    steps_per_epoch = math.ceil(len(train) / cfg.batch_size)
    optimizer, scheduler = _optimizer(model, cfg, total_steps=steps_per_epoch * cfg.epochs)
    shuffle = torch.Generator().manual_seed(cfg.seed + 1)
    for epoch in range(1, cfg.epochs + 1):
        train_loss = _train_epoch(model, encoded["train"], tokenizer.pad_token_id, cfg.batch_size,
                                  optimizer, scheduler, shuffle)
        dev_labels, dev_pred = _predict(model, encoded["dev"], tokenizer.pad_token_id, cfg.eval_batch_size)
        dev = scores(dev_labels, dev_pred, task.num_labels)
        history.append({"epoch": epoch, "train_loss": round(train_loss, 5), "dev": dev})
        log(f"finetune {task.name}: epoch {epoch}/{cfg.epochs} train loss {train_loss:.4f} "
            f"dev acc {dev['accuracy']:.4f} macro-F1 {dev['macro_f1']:.4f}")
        if best is None or dev["macro_f1"] > best[1]["macro_f1"]:
            best = (epoch, dev, copy.deepcopy(model.state_dict()))

    best_epoch, best_dev, best_state = best
    model.load_state_dict(best_state)
    test_labels, test_pred = _predict(model, encoded["test"], tokenizer.pad_token_id, cfg.eval_batch_size)
    test = scores(test_labels, test_pred, task.num_labels)

    majority = majority_label([e.label for e in train])
    baseline = {"label": majority, "label_name": task.label_names[majority],
                **{s: scores([e.label for e in ex], [majority] * len(ex), task.num_labels) for s, ex in evals.items()}}
    log(f"finetune {task.name}: test acc {test['accuracy']:.4f} macro-F1 {test['macro_f1']:.4f} "
        f"(majority baseline acc {baseline['test']['accuracy']:.4f} macro-F1 {baseline['test']['macro_f1']:.4f})")
    return {
        "task": task.name,
        "label_names": list(task.label_names),
        "export": str(Path(cfg.export_dir).resolve()),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
        "train_examples": len(train),
        "train_label_counts": [sum(1 for e in train if e.label == k) for k in range(task.num_labels)],
        "truncated_share": {s: round(enc["truncated"] / max(1, len(enc["labels"])), 4) for s, enc in encoded.items()},
        "unk_token_share": {s: round(enc["unk_share"], 4) for s, enc in encoded.items()},
        "epochs": history,
        "best_epoch": best_epoch,
        "dev": best_dev,
        "test": test,
        "majority_baseline": baseline,
        "seconds": round(time.perf_counter() - started, 1),
    }


def side_by_side(report: dict) -> str:
    """The pretrained export next to its random-init twin (report["random_init"]) and the majority baseline."""
    twin, base = report["random_init"], report["majority_baseline"]["test"]
    rows = [("pretrained export", report["test"]), ("random-init twin", twin["test"]), ("majority baseline", base)]
    lines = [f"finetune {report['task']} ({report['train_examples']} training examples), test split:",
             f"  {'':<18} {'accuracy':>9} {'macro-F1':>9}"]
    lines += [f"  {name:<18} {s['accuracy']:>9.4f} {s['macro_f1']:>9.4f}" for name, s in rows]
    gain = report["test"]["accuracy"] - twin["test"]["accuracy"]
    lines.append(f"  pretraining changed test accuracy by {gain * 100:+.1f} points")
    return "\n".join(lines)


def _encode(tokenizer, examples, max_length: int) -> dict:
    texts = [e.text for e in examples]
    full = tokenizer(texts, add_special_tokens=True, truncation=False)["input_ids"]
    ids = tokenizer(texts, add_special_tokens=True, truncation=True, max_length=max_length)["input_ids"]
    # SentencePiece folds a run of unknown characters into ONE [UNK]: a tokenizer trained without
    # the task's script shows up here (and as short inputs), not as an error.
    unk = tokenizer.unk_token_id
    unk_count = sum(seq.count(unk) for seq in full) if unk is not None else 0
    return {"input_ids": ids, "labels": [e.label for e in examples],
            "truncated": sum(1 for a in full if len(a) > max_length),
            "unk_share": unk_count / max(1, sum(len(seq) - 2 for seq in full))}


def _collate(input_ids: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    width = max(len(x) for x in input_ids)
    ids = torch.full((len(input_ids), width), pad_id, dtype=torch.long)  # (B, T)
    mask = torch.zeros((len(input_ids), width), dtype=torch.long)  # (B, T)
    for row, seq in enumerate(input_ids):
        ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[row, : len(seq)] = 1
    return ids, mask


def _optimizer(model: torch.nn.Module, cfg: FinetuneConfig, total_steps: int):
    import torch

    decay, no_decay = [], []
    for name, param in model.named_parameters():
        (no_decay if param.ndim < 2 else decay).append(param)  # biases and LayerNorm weights
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr)
    warmup = max(1, int(cfg.warmup_ratio * total_steps))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _train_epoch(model, data: dict, pad_id: int, batch_size: int, optimizer, scheduler, generator) -> float:
    import torch

    model.train()
    order = torch.randperm(len(data["labels"]), generator=generator).tolist()
    total, count = 0.0, 0
    for start in range(0, len(order), batch_size):
        rows = order[start: start + batch_size]
        ids, mask = _collate([data["input_ids"][i] for i in rows], pad_id)
        labels = torch.tensor([data["labels"][i] for i in rows], dtype=torch.long)
        loss = model(ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        total += float(loss.detach()) * len(rows)
        count += len(rows)
    return total / max(1, count)


def _predict(model, data: dict, pad_id: int, batch_size: int) -> tuple[list[int], list[int]]:
    """Predictions in the split's order; batches are formed by length so padding stays small."""
    import torch

    model.eval()
    by_length = sorted(range(len(data["labels"])), key=lambda i: len(data["input_ids"][i]))
    predictions = [0] * len(by_length)
    with torch.no_grad():
        for start in range(0, len(by_length), batch_size):
            rows = by_length[start: start + batch_size]
            ids, mask = _collate([data["input_ids"][i] for i in rows], pad_id)
            for row, label in zip(rows, model(ids, attention_mask=mask).logits.argmax(dim=-1).tolist()):
                predictions[row] = label
    return list(data["labels"]), predictions

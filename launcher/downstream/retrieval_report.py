"""The JSON report of a retrieval fine-tune: the keys of the other task types (finetune_report), with
retrieval's metrics and, as the baseline, the model before fine-tuning (zero-shot, mean over seeds).

Keys: task, task_type ("retrieval"), files (incl. corpus), columns (query, passage, negative,
corpus_text), export, config, select_metric, held_out, seeds, chosen_seed, train_examples, sizes
(rows / queries / ranked passages per split), truncated_share (queries and passages cut at
max_length), runs (per seed: epochs with dev scores, best epoch, dev, test, zero_shot),
aggregate (mean / min / max / n of every metric on dev and test), dev / test (the means),
baseline (zero-shot), seconds. docs/finetune.md lists them for users.
"""
from __future__ import annotations

from pathlib import Path

from launcher.downstream.finetune_report import run_entries
from launcher.downstream.task_metrics import METRICS, spread


def build_retrieval_report(cfg, data, evals: dict, runs: list[dict], select: str, chosen_seed: int,
                           truncated: dict, seconds: float) -> dict:
    metrics = list(METRICS["retrieval"])

    def summary(pick) -> tuple[dict, dict]:
        aggregate = {split: {m: spread([pick(r, split)[m] for r in runs]) for m in metrics}
                     for split in ("dev", "test") if pick(runs[0], split) is not None}
        means = {split: {**{m: values[m]["mean"] for m in metrics},
                         **{k: pick(runs[0], split)[k] for k in ("queries", "passages")}}
                 for split, values in aggregate.items()}
        return aggregate, means

    aggregate, means = summary(lambda run, split: run[split])
    _, zero_shot = summary(lambda run, split: run["zero_shot"].get(split))
    spec = data.spec
    files = {s: str(Path(p).resolve()) for s, p in spec.files.items()}
    if spec.corpus is not None:
        files["corpus"] = str(Path(spec.corpus).resolve())
    return {
        "task": spec.name,
        "task_type": "retrieval",
        "files": files,
        "columns": {"query": spec.text_column, "passage": spec.text_pair_column, "negative": spec.negative_column,
                    "corpus_text": spec.corpus_text_column if spec.corpus is not None else None},
        "dev_fraction": spec.dev_fraction,
        **run_entries(cfg, select, evals, chosen_seed),
        "train_examples": runs[0]["train_examples"],
        "sizes": {"train": {"rows": len(data.train), "queries": len(set(data.train.queries))},
                  **{s: {"rows": len(split), "queries": len(set(split.queries)), "passages": len(split.pool(data.corpus))}
                     for s, split in evals.items()},
                  "corpus": len(data.corpus)},
        "truncated_share": truncated,
        "runs": runs,
        "aggregate": aggregate,
        "dev": means["dev"],
        "test": means.get("test"),
        "baseline": {"kind": "zero-shot", **zero_shot},
        "seconds": round(seconds, 1),
    }


def truncation(tokenizer, splits: dict, corpus: list[str], max_length: int) -> dict:
    """Share of each split's distinct queries and passages longer than `max_length` tokens ([CLS] and
    [SEP] included), i.e. cut by the model."""
    def share(texts: list[str]) -> float:
        texts = list(dict.fromkeys(texts))
        if not texts:
            return 0.0
        lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=True, truncation=False)["input_ids"]]
        return round(sum(n > max_length for n in lengths) / len(texts), 4)

    result = {name: {"queries": share(split.queries), "passages": share(split.passages + (split.negatives or []))}
              for name, split in splits.items()}
    if corpus:
        result["corpus"] = {"passages": share(corpus)}
    return result

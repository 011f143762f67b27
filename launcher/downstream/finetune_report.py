"""What `roformer finetune` hands back: the JSON report, the console table, the saved model, the predictions.

Report keys (docs/finetune.md): task, task_type, label_names / label2id (classification), the task's
files and columns, config, select_metric, held_out ("test", or "dev" without a test file), per-seed
runs (epochs, best epoch, dev and test scores), `aggregate` (mean / min / max / n of every metric on
dev and test over the seeds), `dev` / `test` (the means; the keys older readers use), `baseline`
(majority class or train mean; also as `majority_baseline` for classification, as before), train
size and label counts, truncated and [UNK] shares, seconds.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path

from launcher.common.errors import UserError
from launcher.common.io import atomic_write_text
from launcher.downstream.task_metrics import METRICS, baseline_prediction, scores, spread

PREDICTION_FORMATS = (".csv", ".tsv", ".jsonl")


def build_report(cfg, data, encoded: dict, evals: dict, seed_reports: list[dict], select: str, chosen_seed: int,
                 seconds: float) -> dict:
    train_labels = seed_reports[0]["train_labels"]
    runs = [{k: v for k, v in r.items() if k != "train_labels"} for r in seed_reports]
    metrics = list(METRICS[data.task_type])
    aggregate = {split: {m: spread([r[split][m] for r in runs]) for m in metrics}
                 for split in ("dev", "test") if runs[0][split] is not None}
    means = {split: {**{m: values[m]["mean"] for m in metrics}, "examples": runs[0][split]["examples"]}
             for split, values in aggregate.items()}
    guess = baseline_prediction(data.task_type, train_labels)
    baseline = {"kind": "majority class" if data.task_type == "classification" else "train mean",
                "prediction": data.label_names[guess] if data.label_names else round(guess, 5),
                **{s: scores(data.task_type, enc["labels"], [guess] * len(enc["labels"]), data.num_labels)
                   for s, enc in encoded.items() if s != "train"}}
    spec = data.spec
    report = {
        "task": spec.name,
        "task_type": data.task_type,
        "label_names": data.label_names,
        "label2id": {name: i for i, name in enumerate(data.label_names)} if data.label_names else None,
        "files": {s: str(Path(p).resolve()) for s, p in spec.files.items()},
        "columns": {"text": spec.text_column, "text_pair": spec.text_pair_column, "label": spec.label_column},
        "dev_fraction": spec.dev_fraction,
        **run_entries(cfg, select, evals, chosen_seed),
        "train_examples": len(train_labels),
        "train_label_counts": [train_labels.count(k) for k in range(data.num_labels)]
        if data.task_type == "classification" else None,
        "truncated_share": {s: round(enc["truncated"] / max(1, len(enc["labels"])), 4) for s, enc in encoded.items()},
        "unk_token_share": {s: round(enc["unk_share"], 4) for s, enc in encoded.items()},
        "runs": runs,
        "aggregate": aggregate,
        "dev": means["dev"],
        "test": means.get("test"),
        "baseline": baseline,
        "seconds": round(seconds, 1),
    }
    if data.task_type == "classification":
        report["majority_baseline"] = {**baseline, "label": guess, "label_name": baseline["prediction"]}
    return report


def run_entries(cfg, select: str, evals: dict, chosen_seed: int) -> dict:
    """The report keys every task type shares: the export, the settings, the metric that picked the epoch
    and seed, the held-out split and the seeds."""
    return {"export": str(Path(cfg.export_dir).resolve()), "config": config_entry(cfg), "select_metric": select,
            "held_out": "test" if "test" in evals else "dev", "seeds": list(cfg.seeds), "chosen_seed": chosen_seed}


def config_entry(cfg) -> dict:
    """The report's `config`: every FinetuneConfig setting as JSON values (not the task, which has its own keys)."""
    return {f.name: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v)
            for f in dataclasses.fields(cfg) if f.name not in ("task", "keep_best_state") for v in [getattr(cfg, f.name)]}


def console_table(report: dict) -> str:
    """A few lines for the terminal: every metric on the held-out split (mean [min, max] over the seeds)
    for the export, its random-init twin when compared, and the baseline."""
    split = report["held_out"]
    metrics = list(METRICS[report["task_type"]])
    n = len(report["seeds"])
    rows = [("pretrained export" if report["config"]["init"] == "pretrained" else "random-init model", report)]
    if isinstance(report.get("random_init"), dict):
        rows.append(("random-init twin", report["random_init"]))
    width = 19 if n == 1 else 27
    lines = [f"finetune {report['task']} ({report['task_type']}, {report['train_examples']} training examples, "
             f"{n} seed{'s' if n > 1 else ''}{', mean [min, max]' if n > 1 else ''}), {split} split:",
             "  " + f"{'':<24}" + "".join(f"{m:>{width}}" for m in metrics)]
    for name, entry in rows:
        cells = [_cell(entry["aggregate"][split][m], n) for m in metrics]
        lines.append("  " + f"{name:<24}" + "".join(f"{c:>{width}}" for c in cells))
    base = report["baseline"][split]
    lines.append("  " + f"{report['baseline']['kind'] + ' baseline':<24}"
                 + "".join(f"{_number(base[m]):>{width}}" for m in metrics))
    if len(rows) == 2:
        metric = report["select_metric"]
        ours, twin = (entry["aggregate"][split][metric]["mean"] for _, entry in rows)
        if ours is not None and twin is not None:
            lines.append(f"  pretraining changed {split} {metric} by {ours - twin:+.4f}")
    return "\n".join(lines)


def _number(value) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _cell(values: dict, n: int) -> str:
    if n == 1 or values["mean"] is None:
        return _number(values["mean"])
    return f"{values['mean']:.4f} [{values['min']:.3f}, {values['max']:.3f}]"


# --------------------------------------------------------------------------- outputs beside the report


def check_outputs(save_model: Path | None, predictions: Path | None) -> None:
    """Refuse unusable output paths before any compute (an existing model directory is never replaced)."""
    if save_model is not None and Path(save_model).exists():
        raise UserError(f"--save-model {save_model}: already exists (choose a new directory; nothing is replaced)")
    if predictions is not None and Path(predictions).suffix.lower() not in PREDICTION_FORMATS:
        raise UserError(f"--predictions {predictions}: unknown extension (use {', '.join(PREDICTION_FORMATS)})")


def save_model(model, export_dir: Path, tokenizer, data, out_dir: Path) -> Path:
    """The fine-tuned classifier as a transformers directory (config.json with id2label / label2id and
    problem_type, model.safetensors, the tokenizer), built beside `out_dir` and renamed into place."""
    from roformer.hf_interop import DEFAULT_HF_MAX_POSITIONS, write_pretrained_files

    export_config = json.loads((Path(export_dir) / "config.json").read_text(encoding="utf-8"))
    with staged_directory(out_dir) as staging:
        write_pretrained_files(model, staging, export_config.get("max_position_embeddings", DEFAULT_HF_MAX_POSITIONS))
        config_path = staging / "config.json"
        config = json.loads(config_path.read_text(encoding="utf-8"))
        names = data.label_names if data.label_names is not None else [data.spec.label_column]
        config["id2label"] = {str(i): name for i, name in enumerate(names)}
        config["label2id"] = {name: i for i, name in enumerate(names)}
        config["problem_type"] = "single_label_classification" if data.label_names else "regression"
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        tokenizer.save_pretrained(str(staging))
    return Path(out_dir)


@contextlib.contextmanager
def staged_directory(out_dir: Path):
    """--save-model's directory: yields a hidden directory beside `out_dir` to write into, renamed to
    `out_dir` when the block ends without error (never replacing one that appeared meanwhile); removed
    otherwise."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        yield staging
        if out_dir.exists():
            raise UserError(f"--save-model {out_dir}: appeared while fine-tuning; nothing is replaced")
        os.replace(staging, out_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging)


def write_predictions(path: Path, data, split, predictions: list) -> None:
    """One row per held-out example: its row number in the input file, the prediction (label string or
    score) and the gold label; .csv / .tsv / .jsonl by extension, written atomically."""
    name = (lambda v: data.label_names[v]) if data.label_names else (lambda v: round(float(v), 6))  # noqa: E731
    rows = [{"row": r, "prediction": name(p), "label": name(g)}
            for r, p, g in zip(split.rows, predictions, split.labels)]
    write_table(path, rows, ["row", "prediction", "label"])


def write_table(path: Path, rows: list[dict], fields: list[str]) -> None:
    """`rows` as .csv / .tsv (a header line) or .jsonl by `path`'s extension, written atomically."""
    import csv
    import io

    path = Path(path)
    if path.suffix.lower() == ".jsonl":
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    else:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=fields, delimiter="\t" if path.suffix.lower() == ".tsv" else ",",
                                lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        text = buffer.getvalue()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)

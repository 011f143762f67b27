"""Tables of finished runs, shared by the parts of results.json: one pretraining run's summary, a
comparison of groups of runs, and fine-tune scores over seeds."""
from __future__ import annotations

import json
import statistics
from collections import defaultdict

from launcher.reproduce.job_runner import Layout, is_finished, trained_steps
from launcher.reproduce.reproduction_plan import FinetuneRun, PretrainRun
from launcher.reproduce.seed_spread import spread
from launcher.run_dir.layout import RunDir
from launcher.train.metrics import read_metrics


def pretrain_summary(run: PretrainRun, layout: Layout) -> dict:
    """Validation curve, final validation figures and throughput of one pretraining run."""
    run_dir = layout.run_dir(run)
    valid = read_metrics(run_dir, "valid")
    train = read_metrics(run_dir, "train")
    stages_path = RunDir(run_dir).stages
    stages = json.loads(stages_path.read_text(encoding="utf-8"))["stages"] if stages_path.is_file() else []
    step_times = [r["step_time_s"] for r in train if "step_time_s" in r]
    return {
        "finished": is_finished(run_dir),
        "steps": trained_steps(run_dir),
        "valid_curve": [[r["step"], r["loss"], r["mlm_accuracy"]] for r in valid],
        "final_valid_loss": valid[-1]["loss"] if valid else None,
        "final_valid_accuracy": valid[-1]["mlm_accuracy"] if valid else None,
        "train_seconds": round(sum(step_times), 1),
        "median_tokens_per_s": statistics.median([r["tokens_per_s"] for r in train]) if train else None,
        "stages": stages,
    }


def comparison(runs: list[PretrainRun], layout: Layout) -> dict:
    """Per group (encoding / attention variant): every finished seed's summary and the final loss spread.

    A run still training (or never started) is listed under "unfinished" and left out of the figures:
    its last validation is not a final one.
    """
    groups: dict[str, dict] = defaultdict(lambda: {"runs": {}, "unfinished": []})
    for run in runs:
        summary = pretrain_summary(run, layout)
        if summary["finished"]:
            groups[run.group]["runs"][run.name] = summary
        else:
            groups[run.group]["unfinished"].append(run.name)
    for group in groups.values():
        finals = [r["final_valid_loss"] for r in group["runs"].values() if r["final_valid_loss"] is not None]
        group["final_valid_loss"] = spread(finals)
        accuracies = [r["final_valid_accuracy"] for r in group["runs"].values() if r["final_valid_accuracy"] is not None]
        group["final_valid_accuracy"] = spread(accuracies)
    return dict(groups)


def _report(run: FinetuneRun, layout: Layout) -> dict | None:
    path = layout.finetune_report(run)
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def finetune_table(runs: list[FinetuneRun], layout: Layout, key) -> dict:
    """Test accuracy and macro-F1 over seeds, grouped by key(run) (a tuple of labels)."""
    grouped: dict[tuple, list[dict]] = defaultdict(list)
    for run in runs:
        report = _report(run, layout)
        if report is not None:
            grouped[key(run)].append(report)
    table: dict = {}
    for labels, reports in grouped.items():
        node = table
        for label in labels[:-1]:
            node = node.setdefault(label, {})
        node[labels[-1]] = {
            "accuracy": spread([r["test"]["accuracy"] for r in reports]),
            "macro_f1": spread([r["test"]["macro_f1"] for r in reports]),
            "dev_accuracy": spread([r["dev"]["accuracy"] for r in reports]),
            "majority_baseline_accuracy": reports[0]["majority_baseline"]["test"]["accuracy"],
            "train_examples": reports[0]["train_examples"],
            "truncated_share_test": reports[0]["truncated_share"].get("test"),
            "seconds": spread([r["seconds"] for r in reports]),
        }
    return table

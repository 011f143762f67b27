"""Every number of a reproduction, gathered from its run directories and fine-tune reports.

`collect(...)` returns one JSON-ready dict (written as OUT/report/results.json): per compared
group of pretraining runs the validation curves and the final validation loss over seeds; per
fine-tune setting the test accuracy / macro-F1 over seeds. Spread is always reported as mean, min,
max and n: with three seeds a standard deviation says little.
"""
from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

from launcher.reproduce.plan import FinetuneRun, Preset, PretrainRun
from launcher.reproduce.runner import Layout, is_finished, trained_steps
from launcher.run_dir.layout import RunDir
from launcher.train.metrics import read_metrics


def spread(values: list[float]) -> dict:
    """mean / min / max / n of some seeds' values ({"n": 0} when there are none)."""
    if not values:
        return {"n": 0}
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values), "n": len(values)}


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


def budget_label(budget: int | None) -> str:
    return "all" if budget is None else str(budget)


def collect(preset: Preset, layout: Layout, parts: tuple[str, ...]) -> dict:
    pretrain = preset.pretrain_runs(parts)
    finetune = preset.finetune_runs(parts)
    results: dict = {"preset": preset.name, "parts": list(parts)}
    for part in ("encodings", "linear"):
        if part in parts:
            groups = {"encodings": ("rope", "sinusoidal", "learned"), "linear": ("linear+rope", "linear+sinusoidal")}
            results[part] = comparison([r for r in pretrain if r.group in groups[part]], layout)
    recipe = [r for r in pretrain if r.name == preset.recipe_run]
    if recipe:
        results["recipe"] = pretrain_summary(recipe[0], layout)
    if "downstream" in parts:
        table = finetune_table([r for r in finetune if r.part == "downstream"], layout,
                               key=lambda r: (r.task, budget_label(r.budget), r.init))
        for task in table.values():
            for cell in task.values():
                if "pretrained" in cell and "random" in cell and cell["pretrained"]["accuracy"]["n"]:
                    cell["gain_points"] = 100 * (cell["pretrained"]["accuracy"]["mean"]
                                                 - cell["random"]["accuracy"]["mean"])
        results["downstream"] = table
    if "lengths" in parts:
        results["lengths"] = finetune_table([r for r in finetune if r.part == "lengths"], layout,
                                            key=lambda r: (str(r.max_length),))
    return results

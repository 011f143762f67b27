"""PNG figures of a reproduction (matplotlib, Agg backend): one question per picture.

Losses against steps (mean over seeds as a line, min-max as a band), scores against fine-tuning length or
label budget (export vs random-init twin), loss against evaluation length per extension variant; each
function names its figure.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on training machines
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

COLOURS = {"rope": "tab:blue", "sinusoidal": "tab:orange", "learned": "tab:green",
           "linear+rope": "tab:blue", "linear+sinusoidal": "tab:orange",
           "sinusoidal_unscaled": "tab:red", "linear+sinusoidal_unscaled": "tab:red",
           "no-extension": "tab:gray", "same-theta": "tab:blue", "larger-theta": "tab:purple",
           "pretrained": "tab:blue", "random": "tab:gray",
           "linear": "tab:gray", "wsd": "tab:green", "mask-annealed": "tab:purple",
           "three-phase": "tab:green", "recipe": "tab:blue", "random-init twin": "tab:gray",
           "sequence": "tab:blue", "document": "tab:green", "document-positions": "tab:purple",
           "flat-512": "tab:gray", "staged": "tab:blue", "short-then-long": "tab:orange", "staged-ramp": "tab:green"}
SIZE = (10, 6)  # inches at 110 dpi: 1100 x 660 px
DPI = 110


def loss_curves(groups: dict, title: str, path: Path) -> Path:
    """Mean validation loss per group with its min-max band over seeds."""
    fig, ax = plt.subplots(figsize=SIZE)
    boundaries: list[tuple[int, str]] = []
    for group, data in groups.items():
        curves = [run["valid_curve"] for run in data["runs"].values() if run["valid_curve"]]
        if not curves or not data["final_valid_loss"].get("n"):
            continue
        steps = sorted(set.intersection(*[{point[0] for point in curve} for curve in curves]))
        losses = np.array([[dict((p[0], p[1]) for p in curve)[s] for s in steps] for curve in curves])
        final = data["final_valid_loss"]
        label = f"{group}: final {final['mean']:.3f} (min {final['min']:.3f}, max {final['max']:.3f}, n={final['n']})"
        colour = COLOURS.get(group)
        ax.plot(steps, losses.mean(axis=0), color=colour, linewidth=2, label=label)
        ax.fill_between(steps, losses.min(axis=0), losses.max(axis=0), color=colour, alpha=0.2, linewidth=0)
        if not boundaries:
            first = next(iter(data["runs"].values()))
            boundaries = [(s["first_step"], f"{s['max_seq_len']} x {s['global_batch_size']}")
                          for s in first.get("stages", []) if "first_step" in s]
    _mark_stages(ax, boundaries)
    ax.set(title=title, xlabel="optimizer step", ylabel="MLM validation loss (nats per masked token)")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # nothing finished yet: an empty frame, no legend
        ax.legend(loc="lower left")  # losses fall to the right; stage labels sit at the top
    return _save(fig, path)


def _mean_with_range(ax, xs, stats: list[dict], **style) -> None:
    """Each stats entry's mean at xs, with bars from its min to its max."""
    err = np.array([[s["mean"] - s["min"] for s in stats], [s["max"] - s["mean"] for s in stats]])
    ax.errorbar(xs, np.array([s["mean"] for s in stats]), yerr=err, capsize=4, **style)


def lengths(table: dict, trained_max_len: int | None, path: Path) -> Path:
    """inews test accuracy and macro-F1 against the fine-tuning max length (mean, min-max bars)."""
    fig, ax = plt.subplots(figsize=SIZE)
    xs = sorted(int(k) for k in table)
    for metric, marker in (("accuracy", "o"), ("macro_f1", "s")):
        _mean_with_range(ax, xs, [table[str(x)][metric] for x in xs], marker=marker, linewidth=2,
                         label=f"test {metric.replace('_', '-')} (mean, min-max over seeds)")
    if xs:
        ax.axhline(table[str(xs[0])]["majority_baseline_accuracy"], color="black", linestyle="--",
                   linewidth=1, label="majority baseline accuracy")
    if trained_max_len:
        ax.axvline(trained_max_len, color="gray", linestyle=":", label=f"longest pretrained length ({trained_max_len})")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set(title="Long documents (inews): fine-tuning max length (paper Table 5 analog)",
           xlabel="max tokens per document at fine-tuning", ylabel="test score")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    return _save(fig, path)


def downstream(table: dict, path: Path) -> Path:
    """Test accuracy against label budget, export vs random-init twin, one panel per task."""
    tasks = list(table)
    fig, axes = plt.subplots(1, max(1, len(tasks)), figsize=(SIZE[0], SIZE[1] * 0.8), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        budgets = list(table[task])
        xs = np.arange(len(budgets))
        for offset, init in ((-0.08, "pretrained"), (0.08, "random")):
            stats = [table[task][b].get(init, {}).get("accuracy", {"n": 0}) for b in budgets]
            keep = [i for i, s in enumerate(stats) if s["n"]]
            name = "pretrained export" if init == "pretrained" else "random-init twin"
            _mean_with_range(ax, xs[keep] + offset, [stats[i] for i in keep], marker="o", linewidth=2,
                             color=COLOURS[init], label=name)
        ax.axhline(table[task][budgets[0]].get("pretrained", table[task][budgets[0]].get("random", {}))
                   .get("majority_baseline_accuracy", np.nan), color="black", linestyle="--", linewidth=1,
                   label="majority baseline")
        labels = [f"{b}\n({_examples(table[task][b])} ex.)" if b == "all" else b for b in budgets]
        ax.set_xticks(xs, labels)
        ax.set(title=task, xlabel="labelled training examples", ylabel="test accuracy")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    fig.suptitle("What pretraining buys: export vs random-init twin (mean, min-max over fine-tuning seeds)")
    return _save(fig, path)


def extension(table: dict, path: Path) -> Path:
    """MLM validation loss against evaluation length, one line per variant (min-max bars over seeds)."""
    fig, ax = plt.subplots(figsize=SIZE)
    for name in ("no-extension", "same-theta", "larger-theta"):
        variant = table["variants"].get(name)
        if not variant:
            continue
        xs = sorted(int(n) for n in variant["loss"] if variant["loss"][n].get("n"))
        stats = [variant["loss"][str(x)] for x in xs]
        _mean_with_range(ax, xs, stats, marker="o", linewidth=2, color=COLOURS.get(name),
                         label=f"{name} (rope_theta {variant['rope_theta']:g}, n={stats[0]['n'] if stats else 0})")
    stages = table["stages"]["same-theta"]
    for stage, style in ((max(stages[:-1], key=lambda s: s["max_seq_len"]), ":"), (stages[-1], "--")):
        ax.axvline(stage["max_seq_len"], color="gray", linestyle=style, linewidth=1,
                   label=f"{'extension' if stage is stages[-1] else 'longest base'} length ({stage['max_seq_len']})")
    ax.set_xscale("log", base=2)
    ax.set(title="Context extension: MLM loss vs evaluation length (RoPE base as a stage field)",
           xlabel="evaluation length (tokens)", ylabel="MLM validation loss (nats per masked token)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    return _save(fig, path)


def recipe_comparison(table: dict, path: Path) -> Path:
    """Test accuracy per task: the three-phase recipe, recipe.yaml and the random-init twin side by side."""
    tasks = list(table["tasks"])
    xs = np.arange(len(tasks))
    losses = {name: run.get("final_valid_loss") for name, run in table.get("pretraining", {}).items()}
    fig, ax = plt.subplots(figsize=(SIZE[0] * 0.8, SIZE[1] * 0.8))
    for offset, name in ((-0.15, "three-phase"), (0.0, "recipe"), (0.15, "random-init twin")):
        stats = [table["tasks"][task].get(name, {}).get("accuracy", {"n": 0}) for task in tasks]
        keep = [i for i, stat in enumerate(stats) if stat["n"]]
        loss = losses.get(name)
        _mean_with_range(ax, xs[keep] + offset, [stats[i] for i in keep], marker="o", linestyle="none",
                         color=COLOURS[name],
                         label=name + (f" (final MLM loss {loss:.3f})" if loss is not None else ""))
    ax.set_xticks(xs, tasks)
    ax.set(title=f"Three-phase recipe vs recipe.yaml at equal tokens\n({table['budget']} labels; mean, min-max over "
                 "fine-tuning seeds)", ylabel="test accuracy", xlim=(-0.5, len(tasks) - 0.5))
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    return _save(fig, path)


def documents(table: dict, path: Path) -> Path:
    """Per variant (mean, min-max over seeds): loss scored per document at each length, and test accuracy per task."""
    fig, (loss_ax, task_ax) = plt.subplots(1, 2, figsize=SIZE)
    tasks = list(table["finetune"])
    for offset, (variant, cell) in zip((-0.1, 0.0, 0.1), table["variants"].items()):
        losses = cell["loss"].get("document", {})
        xs = sorted(int(n) for n in losses if losses[n].get("n"))
        if xs:  # nudged apart on the log axis: identical variants (positions under RoPE) stay visible
            _mean_with_range(loss_ax, [x * (1 + offset / 3) for x in xs], [losses[str(x)] for x in xs], marker="o",
                             linewidth=2, color=COLOURS.get(variant), label=f"{variant} (n={losses[str(xs[0])]['n']})")
        stats = [table["finetune"][task].get(variant, {}).get("accuracy", {"n": 0}) for task in tasks]
        keep = [i for i, stat in enumerate(stats) if stat["n"]]
        if keep:
            _mean_with_range(task_ax, np.arange(len(tasks))[keep] + offset, [stats[i] for i in keep], marker="o",
                             linestyle="none", color=COLOURS.get(variant), label=variant)
    loss_ax.set_xscale("log", base=2)
    loss_ax.set(title="MLM loss, each document scored alone", xlabel="evaluation length (tokens)",
                ylabel="MLM validation loss (nats per masked token)")
    task_ax.set_xticks(np.arange(len(tasks)), tasks)
    task_ax.set(title=f"Fine-tuned at {table['budget']} labels", ylabel="test accuracy",
                xlim=(-0.5, max(len(tasks), 1) - 0.5))
    for ax in (loss_ax, task_ax):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best")
    fig.suptitle("Packed documents seen whole (sequence) or apart (document), at equal tokens")
    return _save(fig, path)


def schedules(table: dict, path: Path) -> Path:
    """Validation loss against training wall time per schedule: seeds' mean (line) and min-max (band), at the
    validation steps every seed shares, each at the seeds' mean wall time."""
    fig, ax = plt.subplots(figsize=SIZE)
    for variant, cell in table["variants"].items():
        curves = [{p[0]: (p[1], p[2]) for p in run["wall_curve"]} for run in cell["runs"].values() if run["wall_curve"]]
        if not curves:
            continue
        steps = sorted(set.intersection(*[set(curve) for curve in curves]))
        walls = np.array([[curve[s][0] for s in steps] for curve in curves]).mean(axis=0)
        losses = np.array([[curve[s][1] for s in steps] for curve in curves])
        colour = COLOURS.get(variant)
        ax.plot(walls, losses.mean(axis=0), color=colour, linewidth=2, label=f"{variant} (n={len(curves)})")
        ax.fill_between(walls, losses.min(axis=0), losses.max(axis=0), color=colour, alpha=0.2, linewidth=0)
    ax.set(title="MLM validation loss against training wall time: staged vs flat at equal token slots",
           xlabel="training wall time (s, sum of step times)",
           ylabel="validation loss at the stage's length (nats per masked token)")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper right")
    return _save(fig, path)


def _examples(cell: dict) -> str:
    for init in ("pretrained", "random"):
        if init in cell:
            return str(cell[init]["train_examples"])
    return "?"


def _mark_stages(ax, boundaries: list[tuple[int, str]]) -> None:
    for start, label in boundaries:
        ax.axvline(start, color="gray", linestyle=":", linewidth=1)
        ax.annotate(f"stage: {label}", (start, 1.0), xycoords=("data", "axes fraction"), xytext=(3, -12),
                    textcoords="offset points", fontsize=8, color="dimgray")


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fig.tight_layout()
    fig.savefig(tmp, dpi=DPI, format="png")
    plt.close(fig)
    tmp.replace(path)
    return path

"""PNG figures of a run, rendered with matplotlib's Agg backend (no display, no pyplot state).

One figure per question (curves against steps and tokens, learning rate, the global batch and the LR against
tokens for a batch ramp or a batch-scaled LR, throughput, loss scale, the measured critical batch beside the batch,
eval-mlm, fine-tune: docs/training.md,
"Plots and the run report"), each 1200 x 800 px with the stage boundaries marked. A schedule written in tokens
(curves.py Curves.unit) has its per-step figures drawn against tokens instead of steps. Per-step train curves are drawn raw and smoothed within each stage, so a loss jump at a
length change is not smeared across the boundary.
"""
from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np

from launcher.common.io import atomic_write_bytes
from launcher.report.curves import Curves
from launcher.report.run_summary import RunSummary, finetune_rows

FIGSIZE, DPI = (12, 8), 100
RAW_POINTS = 4000
"""Above this many steps, the raw per-step line becomes a min-max band over buckets of steps."""
TRAIN, VALID, EXTRA = "tab:blue", "tab:orange", "tab:green"


def render_all(curves: Curves, summary: RunSummary, out_dir: Path) -> list[Path]:
    """Render every figure the data allows into out_dir; returns the files written, in display order.
    A figure that cannot be drawn (an eval report of an unexpected shape, say) is named on stderr and
    skipped: the others are still written."""
    figures = {"curves_steps.png": lambda: _loss_accuracy(curves, summary, "step"),
               "curves_tokens.png": lambda: _loss_accuracy(curves, summary, "tokens"),
               "learning_rate.png": lambda: _learning_rate(curves, summary),
               "batch_lr_tokens.png": lambda: _batch_and_lr(curves, summary) if wants_batch_lr(curves, summary)
               else None,
               "throughput.png": lambda: _throughput(curves, summary),
               "loss_scale.png": lambda: _loss_scale(curves, summary) if wants_loss_scale(curves, summary) else None,
               "critical_batch.png": lambda: _critical_batch(curves, summary)
               if curves.optional("grad_noise_scale") else None,
               "eval_mlm.png": lambda: _eval_mlm(summary),
               "finetune.png": lambda: _finetune(summary)}
    written = []
    for name, draw in figures.items():
        try:
            figure = draw()
            if figure is None:
                continue
            _legend(figure)
            buffer = io.BytesIO()
            figure.savefig(buffer, format="png", dpi=DPI)
        except Exception as err:  # noqa: BLE001  one bad input must not cost the other figures
            print(f"report: {name} not drawn ({type(err).__name__}: {err})", file=sys.stderr)
            continue
        atomic_write_bytes(Path(out_dir) / name, buffer.getvalue())
        written.append(Path(out_dir) / name)
    return written


def wants_batch_lr(curves: Curves, summary: RunSummary) -> bool:
    """The batch-and-LR plot: when some stage ramps its batch or the LR is scaled to the batch."""
    scaling = (summary.config.get("optimizer") or {}).get("batch_scaling") or "none"
    return len(curves.train) > 0 and (curves.has_ramp() or scaling != "none")


def wants_loss_scale(curves: Curves, summary: RunSummary) -> bool:
    scale = curves.train.loss_scale[np.isfinite(curves.train.loss_scale)]
    return len(scale) > 0 and (summary.precision == "fp16" or bool(np.ptp(scale) > 0))


# --- the figures ------------------------------------------------------------------------------------


def _loss_accuracy(curves: Curves, summary: RunSummary, axis: str):
    train, valid = curves.train, curves.valid
    if not len(train) and not len(valid):
        return None
    fig, (loss_ax, acc_ax) = _figure(2, f"MLM loss and accuracy against {_AXIS_NAMES[axis]}", curves, summary)
    x_train = train.step if axis == "step" else train.tokens
    x_valid = valid.step if axis == "step" else valid.tokens
    for ax, y_train, y_valid in ((loss_ax, train.loss, valid.loss), (acc_ax, train.accuracy, valid.accuracy)):
        _raw_and_smoothed(ax, x_train, y_train, train.stage, TRAIN, "train")
        if len(valid):
            ax.plot(x_valid, y_valid, "o-", color=VALID, markersize=5 if len(valid) <= 60 else 2.5, linewidth=1.5,
                    label="validation (same held-out batches each time)")
    loss_ax.set_ylabel("MLM loss (cross-entropy, nats)")
    acc_ax.set_ylabel("MLM accuracy (share of masked tokens)")
    _mark_stages(curves, (loss_ax, acc_ax), axis)
    _mark_restarts(curves, summary, (loss_ax, acc_ax), axis)
    _mark_guard(curves, loss_ax, axis)
    _x_axis(acc_ax, axis, curves)
    return fig


def _mark_restarts(curves: Curves, summary: RunSummary, axes, axis: str) -> None:
    """A red dotted line where each fault of RUN_DIR/restarts.json happened (solid: the run gave up there)."""
    train = curves.train
    if not summary.restarts or not len(train):
        return
    for k, record in enumerate(summary.restarts):
        x = record.failed_at_step if axis == "step" else float(np.interp(record.failed_at_step, train.step, train.tokens))
        label = ("restart (roformer pretrain --max-restarts)" if record.action == "restart" else "gave up") \
            if k == 0 or record.action != "restart" else None
        for i, ax in enumerate(axes):
            ax.axvline(x, color="tab:red", linestyle=":" if record.action == "restart" else "-", linewidth=1.5,
                       label=label if i == 0 else None)


GUARD_COLOURS = {"warn": "tab:orange", "rewind": "tab:purple", "stop": "black"}


def _mark_guard(curves: Curves, loss_ax, axis: str) -> None:
    """A dashed line at each numerics-guard trigger (colour: its action), with a cross at the spiking loss."""
    train = curves.train
    if not len(train):
        return
    labelled = set()
    for event in (e for e in curves.events if e.get("event") == "guard" and isinstance(e.get("step"), int)):
        action = event.get("action", "warn")
        x = event["step"] if axis == "step" else float(np.interp(event["step"], train.step, train.tokens))
        label = None if action in labelled else f"numerics guard: {action}"
        labelled.add(action)
        loss_ax.axvline(x, color=GUARD_COLOURS.get(action, "tab:orange"), linestyle="--", linewidth=1.5, label=label)
        value = event.get("value")
        if event.get("figure") == "loss" and isinstance(value, (int, float)) and np.isfinite(value):
            loss_ax.plot([x], [value], "x", color=GUARD_COLOURS.get(action, "tab:orange"), markersize=8)


def _learning_rate(curves: Curves, summary: RunSummary):
    train = curves.train
    if not len(train):
        return None
    has_norm = bool(np.isfinite(train.grad_norm).any())
    fig, axes = _figure(2 if has_norm else 1, "learning rate and gradient norm" if has_norm else "learning rate",
                        curves, summary)
    axis = curves.x_axis
    x = _x(curves, axis)
    axes[0].plot(x, train.lr, color=TRAIN, linewidth=1.8, label="learning rate (set every step)")
    axes[0].set_ylabel("learning rate")
    axes[0].yaxis.set_major_formatter(_formatter(lambda v: f"{v:.1e}" if v else "0"))
    if has_norm:
        _raw_and_smoothed(axes[1], x, train.grad_norm, train.stage, EXTRA, "gradient norm")
        norms = train.grad_norm[np.isfinite(train.grad_norm) & (train.grad_norm > 0)]
        wide = len(norms) and norms.max() > 20 * norms.min()  # early spikes: a log scale keeps the rest visible
        axes[1].set_yscale("log" if wide else "linear")
        axes[1].set_ylabel("gradient L2 norm (before clipping" + (", log scale)" if wide else ")"))
    _mark_stages(curves, axes, axis)
    _x_axis(axes[-1], axis, curves)
    return fig


def _batch_and_lr(curves: Curves, summary: RunSummary):
    """The global batch of every step and the LR set at it, against tokens: a batch ramp's steps and the LR that
    follows the batch (optimizer.batch_scaling) in one view, each stage marked."""
    train = curves.train
    optimizer = summary.config.get("optimizer") or {}
    scaling = optimizer.get("batch_scaling") or "none"
    fig, axes = _figure(2, "global batch and learning rate against tokens", curves, summary)
    # Step i trains the tokens (x[i-1], x[i]] at its batch and LR: steps drawn 'pre', from the first step's start.
    before = train.tokens[0] - train.global_batch_size[0] * _seq_len(curves, 0)
    x = np.concatenate([[before if np.isfinite(before) else 0.0], train.tokens])
    batch, lr = (np.concatenate([column[:1], column]) for column in (train.global_batch_size, train.lr))
    axes[0].step(x, batch, where="pre", color=TRAIN, linewidth=2, label="global batch (sequences per optimizer step)")
    axes[0].set_ylabel("global batch (sequences)")
    _headroom(axes[0], train.global_batch_size, 1.35)
    label = "learning rate" + (f" (the curve x (batch / {optimizer.get('reference_batch')}) ** "
                               f"{'1' if scaling == 'linear' else '1/2'}: batch_scaling {scaling})"
                               if scaling != "none" else "")
    axes[1].step(x, lr, where="pre", color=EXTRA, linewidth=1.8, label=label)
    axes[1].set_ylabel("learning rate")
    axes[1].yaxis.set_major_formatter(_formatter(lambda v: f"{v:.1e}" if v else "0"))
    _headroom(axes[1], train.lr, 1.35)
    _mark_stages(curves, axes, "tokens")
    _x_axis(axes[-1], "tokens", curves)
    return fig


def _critical_batch(curves: Curves, summary: RunSummary):
    """The global batch in force beside the measured critical batch (grad_noise_scale) and each stage's median."""
    train = curves.train
    fig, axes = _figure(1, "global batch and measured critical batch", curves, summary)
    axis = curves.x_axis
    x = _x(curves, axis)
    axes[0].step(x, train.global_batch_size, where="pre", color=TRAIN, linewidth=2, label="global batch in force")
    noise = train.grad_noise_scale
    measured = np.isfinite(noise) & (noise > 0)
    axes[0].plot(x[measured], noise[measured], "o-", color=EXTRA, markersize=3, linewidth=1,
                 label="measured critical batch (B_simple, smoothed)")
    _stage_medians(axes[0], curves, np.where(measured, noise, np.nan), "{:,.0f}", x)
    values = np.concatenate([train.global_batch_size[np.isfinite(train.global_batch_size)], noise[measured]])
    wide = len(values) and values.max() > 20 * values.min()  # estimates scatter by orders of magnitude early on
    axes[0].set_yscale("log" if wide else "linear")
    axes[0].set_ylabel("sequences per optimizer step" + (" (log scale)" if wide else ""))
    _mark_stages(curves, axes, axis)
    _x_axis(axes[-1], axis, curves)
    return fig


def _throughput(curves: Curves, summary: RunSummary):
    train = curves.train
    if not len(train):
        return None
    extra = [name for name in ("mfu", "tflops") if curves.optional(name)]
    fig, axes = _figure(3 if extra else 2, "throughput", curves, summary)
    axis = curves.x_axis
    x = _x(curves, axis)
    _raw_and_smoothed(axes[0], x, train.tokens_per_s, train.stage, TRAIN, "tokens/s")
    _stage_medians(axes[0], curves, train.tokens_per_s, "{:,.0f} tok/s", x)
    axes[0].set_ylabel("tokens/s (non-padding, all ranks)")
    axes[0].yaxis.set_major_formatter(_eng())
    _raw_and_smoothed(axes[1], x, train.step_time_s, train.stage, EXTRA, "step time")
    _stage_medians(axes[1], curves, train.step_time_s, "{:.3g} s", x)
    axes[1].set_ylabel("seconds per optimizer step")
    for ax, values in ((axes[0], train.tokens_per_s), (axes[1], train.step_time_s)):
        _headroom(ax, values)
    if extra:
        _utilisation(axes[2], curves, extra, x)
    _mark_stages(curves, axes, axis)
    _x_axis(axes[-1], axis, curves)
    return fig


def _utilisation(ax, curves: Curves, present: list[str], x: np.ndarray) -> None:
    """Model TFLOP/s per rank, with MFU as the right-hand scale of the same line (MFU = TFLOP/s / the
    peak, so two lines would lie on each other); MFU alone when only it is recorded."""
    train = curves.train
    percent = None
    if "mfu" in present:  # a fraction by contract (launcher/common/mfu.py); a record in percent is kept
        percent = train.mfu * (100 if np.nanmax(train.mfu) <= 1.0 else 1)
    if "tflops" not in present:
        _raw_and_smoothed(ax, x, percent, train.stage, "tab:purple", "MFU")
        ax.set_ylabel("model FLOP utilisation (% of peak)")
        _headroom(ax, percent)
        return
    _raw_and_smoothed(ax, x, train.tflops, train.stage, "tab:brown", "model TFLOP/s per rank")
    ax.set_ylabel("model TFLOP/s per rank")
    _headroom(ax, train.tflops)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = float(np.nanmedian(percent / train.tflops)) if percent is not None else np.nan
    if np.isfinite(ratio) and ratio > 0:  # percent per TFLOP/s = 100 / the peak
        right = ax.secondary_yaxis("right", functions=(lambda t: t * ratio, lambda m: m / ratio))
        right.set_ylabel("MFU (% of the peak)")


def _loss_scale(curves: Curves, summary: RunSummary):
    train = curves.train
    fig, (ax,) = _figure(1, "fp16 dynamic loss scale", curves, summary)
    axis = curves.x_axis
    x = _x(curves, axis)
    ax.step(x, train.loss_scale, where="post", color=TRAIN, linewidth=1.8, label="loss scale")
    ax.set_yscale("log", base=2)
    ax.set_ylabel("loss scale (log2 scale)")
    skipped = np.flatnonzero(np.diff(np.nan_to_num(train.skipped_steps), prepend=0) > 0)
    if len(skipped):
        ax.plot(x[skipped], train.loss_scale[skipped], "x", color="tab:red", markersize=11,
                markeredgewidth=2.5, zorder=3, label=f"step skipped on overflow ({len(skipped)})")
    _mark_stages(curves, (ax,), axis)
    _x_axis(ax, axis, curves)
    return fig


def _eval_mlm(summary: RunSummary):
    reports = [r for r in summary.evals if r.kind == "mlm"]
    if not reports:
        return None
    fig, (loss_ax, acc_ax) = _figure(2, "eval-mlm: masked-LM figures per sequence length", None, summary, sharex=True)
    trained = set()
    for i, report in enumerate(reports):
        rows = sorted(report.content["results"], key=lambda r: r["seq_len"])
        lengths = [r["seq_len"] for r in rows]
        for ax, key in ((loss_ax, "loss"), (acc_ax, "accuracy")):
            values = [float(r[key]) if isinstance(r.get(key), (int, float)) else np.nan for r in rows]
            ax.plot(lengths, values, "o-", color=f"C{i % 10}", linewidth=1.8, markersize=6, label=report.label)
            if len(reports) * len(rows) <= 12:  # few points: the numbers themselves
                for x, y in zip(lengths, values):
                    ax.annotate(f"{y:.4f}", (x, y), textcoords="offset points", xytext=(6, 6), fontsize=9,
                                color=f"C{i % 10}")
        if isinstance(report.content.get("trained_max_seq_len"), int):
            trained.add(report.content["trained_max_seq_len"])
    for ax in (loss_ax, acc_ax):
        for length in sorted(trained):
            ax.axvline(length, color="0.4", linestyle="--", linewidth=1)
            ax.text(length, 0.97, f" longest trained length ({length})", transform=ax.get_xaxis_transform(),
                    va="top", ha="left", fontsize=9, color="0.3")
        ax.set_xscale("log", base=2)
        ax.margins(x=0.08, y=0.15)  # room for the numbers beside the end points
    loss_ax.set_ylabel("MLM loss (cross-entropy, nats)")
    acc_ax.set_ylabel("MLM accuracy (share of masked tokens)")
    acc_ax.set_xlabel("sequence length (tokens, log2 scale)")
    lengths = sorted({r["seq_len"] for report in reports for r in report.content["results"]})
    acc_ax.set_xticks(lengths, [str(n) for n in lengths])
    return fig


def _finetune(summary: RunSummary):
    rows = finetune_rows(summary.evals)
    if not rows:
        return None
    fig, axes = _figure(2, "fine-tuning: test scores against the baselines", None, summary, sharex=True)
    models = [("pretrained", "pretrained export", TRAIN), ("random_init", "random-init twin", "tab:gray"),
              ("majority", "majority-class baseline", "tab:red")]
    width = 0.8 / len(models)
    for ax, metric, name in ((axes[0], "accuracy", "test accuracy"), (axes[1], "macro_f1", "test macro-F1")):
        for k, (key, label, color) in enumerate(models):
            values = [row[key][metric] if row.get(key) else np.nan for row in rows]
            positions = np.arange(len(rows)) + (k - (len(models) - 1) / 2) * width
            bars = ax.bar(positions, values, width, color=color, label=label)
            ax.bar_label(bars, labels=["" if v != v else f"{v:.3f}" for v in values], fontsize=8, padding=2)
        ax.set_ylabel(name)
        ax.set_ylim(0, 1.1)
    axes[1].set_xticks(np.arange(len(rows)), [row["label"] for row in rows])
    for ax in axes:
        ax.grid(axis="x", visible=False)
        ax.set_xlim(-0.75 - max(0, 2 - len(rows)) * 0.5, len(rows) - 0.25 + max(0, 2 - len(rows)) * 0.5)
    axes[1].set_xlabel("task (max length, training examples)")
    return fig


# --- shared pieces ----------------------------------------------------------------------------------

_AXIS_NAMES = {"step": "optimizer steps", "tokens": "tokens trained"}


def _figure(rows: int, what: str, curves: Curves | None, summary: RunSummary, sharex: bool = True):
    from matplotlib.figure import Figure  # no pyplot: no global state, the Agg canvas by default

    fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    axes = fig.subplots(rows, 1, sharex=sharex, squeeze=False)[:, 0]
    where = f"step {curves.train.steps_done}" if curves is not None and len(curves.train) else ""
    total = f"/{summary.total_steps}" if where and summary.total_steps else ""
    fig.suptitle(f"{summary.root.name}: {what}", fontsize=14, fontweight="bold")
    if where:
        fig.text(0.995, 0.995, f"{where}{total} ({summary.status.state})", ha="right", va="top", fontsize=9,
                 color="0.35")
    for ax in axes:
        ax.grid(True, alpha=0.3)
    return fig, list(axes)


def _legend(fig) -> None:
    """One legend for the whole figure, below the axes: never over a curve or a stage label."""
    entries = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    if entries:
        fig.legend(list(entries.values()), list(entries), loc="outside lower center", ncols=min(5, len(entries)),
                   fontsize=10, frameon=False, title=getattr(fig, "smoothing_note", None), title_fontsize=9)


def _eng():
    from matplotlib.ticker import EngFormatter

    return EngFormatter(sep=" ")


def _formatter(text):
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda value, _position: text(value))


def _headroom(ax, values: np.ndarray, factor: float = 1.3) -> None:
    """y from 0 to `factor` x the 99.5th percentile: room for the legend and labels above the data,
    and one slow first step (start-up, compilation) does not flatten the rest."""
    finite = values[np.isfinite(values)]
    if len(finite) and np.percentile(finite, 99.5) > 0:
        ax.set_ylim(0, factor * float(np.percentile(finite, 99.5)))


def _seq_len(curves: Curves, row: int) -> float:
    """max_seq_len of the train record at `row` (its stage's), NaN when the stages are unknown."""
    stage = next((s for s in curves.stages if s.index == curves.train.stage[row]), None)
    return float(stage.max_seq_len) if stage is not None and stage.max_seq_len else np.nan


def _x(curves: Curves, axis: str) -> np.ndarray:
    """The train records' x on `axis`: steps completed, or tokens trained (curves.py TrainCurve.tokens)."""
    return curves.train.step if axis == "step" else curves.train.tokens


def _x_axis(ax, axis: str, curves: Curves | None = None) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_formatter(_eng())
    if axis == "step":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("optimizer steps completed")
    elif curves is not None and curves.unit == "tokens":
        ax.set_xlabel("tokens trained (token slots, batch x length per step: the schedule's unit)")
    else:
        ax.set_xlabel("tokens trained (non-padding, all ranks)")


def _raw_and_smoothed(ax, x: np.ndarray, y: np.ndarray, stage: np.ndarray, color: str, label: str) -> list:
    """The raw per-step values faint (a min-max band past RAW_POINTS steps) and a moving average
    computed within each stage; returns the legend handles."""
    finite = np.isfinite(y) & np.isfinite(x)
    x, y, stage = x[finite], y[finite], stage[finite]
    if not len(x):
        return []
    if len(x) <= RAW_POINTS:
        ax.plot(x, y, color=color, alpha=0.25, linewidth=0.8)
    else:
        buckets = np.array_split(np.arange(len(x)), RAW_POINTS // 2)
        ax.fill_between([x[b].mean() for b in buckets], [y[b].min() for b in buckets], [y[b].max() for b in buckets],
                        color=color, alpha=0.2, linewidth=0)
    window = smoothing_window(len(x))
    smoothed = np.concatenate([moving_average(y[stage == s], window) for s in _runs(stage)])
    line, = ax.plot(x, smoothed, color=color, linewidth=2, label=label)
    if window > 1:
        ax.figure.smoothing_note = f"faint: every step; bold: mean of {window} steps (within each stage)"
    return [line]


def smoothing_window(points: int) -> int:
    """Odd, about 2% of the points: visible trend without hiding a stage's first steps."""
    return max(1, min(501, (points // 50) | 1))


def moving_average(y: np.ndarray, window: int) -> np.ndarray:
    """Centred mean over `window` points, shrinking at the ends (same length as y)."""
    if window <= 1 or len(y) < 2:
        return y.astype(float)
    half = window // 2
    sums = np.concatenate([[0.0], np.cumsum(y, dtype=float)])
    lo = np.clip(np.arange(len(y)) - half, 0, len(y))
    hi = np.clip(np.arange(len(y)) + half + 1, 0, len(y))
    return (sums[hi] - sums[lo]) / (hi - lo)


def _runs(stage: np.ndarray) -> list[float]:
    """Stage indices in order of appearance (the records are sorted by step, so each stage is one run)."""
    return list(dict.fromkeys(stage.tolist()))


def _mark_stages(curves: Curves, axes, axis: str) -> None:
    """A dashed line at each stage start, alternate stages shaded, and `name: length x batch` on the top panel."""
    boundaries = curves.boundaries()
    if not boundaries:
        return
    end = curves.train.step[-1] if axis == "step" else curves.train.tokens[-1]
    start = boundaries[0].step if axis == "step" else boundaries[0].tokens
    # Shared x: the first stage's label sits inside, at the left edge; the last points are not cut.
    axes[0].set_xlim(start, end + 0.015 * max(end - start, 1e-9))
    for k, boundary in enumerate(boundaries):
        x = boundary.step if axis == "step" else boundary.tokens
        x_next = (boundaries[k + 1].step if axis == "step" else boundaries[k + 1].tokens) \
            if k + 1 < len(boundaries) else end
        for ax in axes:
            if k > 0:
                ax.axvline(x, color="0.3", linestyle="--", linewidth=1)
            if k % 2:
                ax.axvspan(x, x_next, color="0.5", alpha=0.07, linewidth=0)
        axes[0].text(x, 0.98, f" {boundary.stage.label}", transform=axes[0].get_xaxis_transform(), rotation=90,
                     va="top", ha="left", fontsize=9, color="0.2",
                     bbox={"facecolor": "white", "alpha": 0.7, "edgecolor": "none", "pad": 1})


def _stage_medians(ax, curves: Curves, values: np.ndarray, fmt: str, x: np.ndarray | None = None) -> None:
    """Each stage's median as a dotted segment over the stage (x: the plot's x, steps by default), labelled."""
    train = curves.train
    x = train.step if x is None else x
    width = max(float(x[-1] - x[0]), 1.0)
    for stage in _runs(train.stage):
        rows = train.stage == stage
        column = values[rows]
        if not np.isfinite(column).any():
            continue
        median = float(np.nanmedian(column))
        x0, x1 = x[rows][0], x[rows][-1]
        ax.hlines(median, x0, x1, colors="black", linestyles=":", linewidth=1.5, label="stage median")
        if (x1 - x0) / width >= 0.08:  # a narrow stage keeps its line; its number is in the report
            ax.text((x0 + x1) / 2, median, f"median {fmt.format(median)}", ha="center", va="bottom", fontsize=8,
                    bbox={"facecolor": "white", "alpha": 0.7, "edgecolor": "none", "pad": 1})

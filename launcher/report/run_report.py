"""report.md: one page on a run, written next to its plots/ (links are relative, so the folder moves).

Sections: status line, what ran, stages with their throughput, the data mixture (planned vs drawn
share per stage and source, when the data has several sources), the curves, checkpoints, evaluations.
Everything comes from launcher.report.curves / run_summary; a missing piece is said, not guessed.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from launcher.outputs.output_paths import REPORT_TITLES
from launcher.report.curves import Curves
from launcher.report.run_summary import RunSummary, finetune_rows
from data_pipeline import DataError, read_manifest
from data_pipeline.manifest import manifest_sources

MAX_CHECKPOINT_ROWS = 8
EVAL_PLOTS = ("eval_mlm.png", "finetune.png")
CAPTIONS = {
    "curves_steps.png": "MLM loss and accuracy against optimizer steps",
    "curves_tokens.png": "MLM loss and accuracy against tokens trained",
    "learning_rate.png": "learning rate and gradient norm",
    "batch_lr_tokens.png": "global batch and learning rate against tokens",
    "throughput.png": "throughput per step, with each stage's median",
    "loss_scale.png": "fp16 dynamic loss scale",
    "critical_batch.png": "the global batch in force and the measured critical batch (gradient noise scale)",
    "eval_mlm.png": "eval-mlm per sequence length",
    "finetune.png": "fine-tuning against the baselines",
}


def write_report_text(curves: Curves, summary: RunSummary, plots: list[Path], report_path: Path) -> str:
    """The Markdown of the report at `report_path` (plot links relative to it)."""
    parts = [f"{REPORT_TITLES[0]}{summary.root.name}",
             f"`{summary.root}`, written {time.strftime('%Y-%m-%d %H:%M:%S')} by `roformer report`.",
             _where(curves, summary),
             "## What ran", _what_ran(summary),
             "## Stages and throughput", _stage_table(curves, summary),
             *(["## Critical batch", critical_batch_text(curves)] if curves.optional("grad_noise_scale") else []),
             *(["## Data mixture", mixture] if (mixture := mixture_section(
                 curves, (summary.config.get("data") or {}).get("data_dir"))) else []),
             "## Curves", _figures(plots, report_path, [n for n in CAPTIONS if n not in EVAL_PLOTS]),
             "## Checkpoints", _checkpoint_table(summary),
             *(["## Restarts", _restart_table(summary)] if summary.restarts else []),
             *(["## Numerics guard", _guard_table(curves)] if guard_events(curves) else []),
             "## Evaluations", _evaluations(summary, plots, report_path)]
    return "\n\n".join(p for p in parts if p) + "\n"


def _where(curves: Curves, summary: RunSummary) -> str:
    train = curves.train
    lines = [f"**Status:** {summary.status.detail}."]
    if len(train):
        done = train.steps_done
        total = summary.total_steps
        stage = next((s for s in curves.stages if s.index == int(train.stage[-1])), None)
        progress = f"step {done:,}" + (f" of {total:,} ({100 * done / total:.0f}%)" if total else "")
        planned = curves.planned_tokens() if curves.unit == "tokens" else 0
        tokens = f"{_count(train.tokens[-1])} of {_count(planned)} tokens (token slots, the schedule's unit)" \
            if planned else f"{_count(train.tokens[-1])} tokens"
        lines.append(f"**Progress:** {progress}, {tokens} trained"
                     + (f", stage {stage.index + 1}/{len(curves.stages)} `{stage.name}`" if stage else "")
                     + f"; last train loss {train.loss[-1]:.4f}, MLM accuracy {train.accuracy[-1]:.4f}.")
    if len(curves.valid):
        lines.append(f"**Last validation** (step {int(curves.valid.step[-1]):,}): loss {curves.valid.loss[-1]:.4f}, "
                     f"MLM accuracy {curves.valid.accuracy[-1]:.4f}.")
    latest = summary.latest
    lines.append(f"**Last checkpoint:** `{latest.tag}` (step {latest.step:,}, stage `{latest.stage_name}`, "
                 f"saved {latest.saved_at})." if latest else "**Last checkpoint:** none yet.")
    if curves.skipped_lines:
        lines.append(f"_{curves.skipped_lines} line(s) of metrics.jsonl were not JSON (cut by a kill?) "
                     "and were skipped._")
    return "  \n".join(lines)


def _wsd_window(optimizer: dict) -> str:
    """The decay window of a warmup-stable-decay run (launcher/config/schedule.py), '' for other decays."""
    if optimizer.get("decay") != "wsd":
        return ""
    steps = optimizer.get("decay_steps") or "the last stage's"
    return f" ({optimizer.get('decay_shape') or '1-sqrt'} over {steps} steps)"


def _batch_scaling(optimizer: dict) -> str:
    """', LR x (batch / 32) ** 1/2' for a run whose LR follows the batch (optimizer.batch_scaling), '' otherwise."""
    scaling = optimizer.get("batch_scaling") or "none"
    if scaling == "none":
        return ""
    return f", LR x (batch / {optimizer.get('reference_batch')}) ** {'1' if scaling == 'linear' else '1/2'} " \
           f"(batch_scaling {scaling})"


def _what_ran(summary: RunSummary) -> str:
    config = summary.config
    model = config.get("model") or {}
    optimizer = config.get("optimizer") or {}
    deepspeed = config.get("deepspeed") or {}
    rows = [("run config", f"`{summary.config_path}`" if config else f"{summary.config_path.name} missing"),
            ("model", ", ".join(f"{k} {model[k]}" for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                             "intermediate_size", "vocab_size", "position_encoding")
                                 if k in model) or "?"),
            ("world size", _plural(summary.world_size, "rank") if summary.world_size else "?"),
            ("precision", summary.precision or "?"),
            ("ZeRO stage", str(summary.zero_stage) if summary.zero_stage is not None else "?"),
            ("DeepSpeed config", f"`{deepspeed['config']}`" if deepspeed.get("config") else "?"),
            ("optimizer", ", ".join(f"{k} {optimizer[k]}" for k in ("lr", "warmup_steps", "decay", "min_lr_ratio")
                                    if k in optimizer) + _wsd_window(optimizer) + _batch_scaling(optimizer) or "?"),
            ("data", f"`{(config.get('data') or {}).get('data_dir', '?')}`")]
    if summary.started_from:  # a branch's source run or init_from's model (RUN_DIR/branch_from.json, init_from.json)
        rows.insert(2, ("started from", summary.started_from))
    if len(summary.versions) > 1:  # a resume changed the config: say from which step each version holds
        rows.append(("config versions", "; ".join(
            f"v{v.version} from step {v.from_step}: " + ", ".join(f"`{name}`" for name in v.files.values())
            for v in summary.versions)))
    return _table(["", ""], rows)


def _stage_table(curves: Curves, summary: RunSummary) -> str:
    if not curves.stages:
        return "_No stages recorded yet (stages.json is written when the run starts)._"
    train = curves.train
    rows = []
    for stage in curves.stages:
        mine = train.stage == stage.index
        done = int(mine.sum())
        shape = f"{stage.max_seq_len} x {stage.batch_text}"  # a batch ramp: its first to its last batch
        micro = _span([piece[1] for piece in stage.ramp]) if stage.ramp else stage.micro_batch_size
        accum = _span([piece[2] for piece in stage.ramp]) if stage.ramp else stage.grad_accum_steps
        split = (f"{micro} x {accum} x {summary.world_size}" if stage.micro_batch_size and summary.world_size
                 else "?")
        steps = f"{done:,} / {stage.steps:,}" if stage.steps else f"{done:,}"
        speed = _median(train.tokens_per_s[mine], "{:,.0f}")
        step_time = _median(train.step_time_s[mine], "{:.3f} s")
        tokens = _count(np.nansum(train.tokens_per_s[mine] * train.step_time_s[mine])) if done else "-"
        utilisation = [_median(train.tflops[mine], "{:.3g}")] if curves.optional("tflops") else []
        utilisation += [_median(100 * train.mfu[mine], "{:.1f}%")] if curves.optional("mfu") else []
        rows.append((str(stage.index + 1), f"`{stage.name}`", shape, split, steps, speed, step_time, *utilisation,
                     tokens))
    extra = ["median TFLOP/s per rank"] if curves.optional("tflops") else []
    extra += ["median MFU"] if curves.optional("mfu") else []
    return _table(["#", "stage", "length x batch", "micro x accum x ranks", "steps done", "median tokens/s",
                   "median step time", *extra, "tokens"], rows)


def critical_batch_text(curves: Curves) -> str:
    """Markdown: per stage "batch N, measured critical batch ~M" (the median of the stage's estimates)."""
    lines = []
    for stage in curves.stages:
        measured = curves.critical_batch(stage.index)
        found = (f"measured critical batch ~{measured[0]:,.0f} (median of {_plural(measured[1], 'estimate')})"
                 if measured else "no estimate")
        lines.append(f"- {stage.index + 1}. `{stage.name}`: batch {stage.batch_text}, {found}")
    return ("\n".join(lines) + "\n\nThe gradient noise scale B_simple (McCandlish et al. 2018), in sequences, measured "
            "every `logging.noise_every` steps: a batch well below it wastes steps, one well above it wastes "
            "samples (docs/training.md, \"Critical batch\").")


def mixture_section(curves: Curves, data_dir: str | None) -> str:
    """Markdown: one table per stage that drew tokens or sets a mixture; "" when there is nothing to show."""
    several = any(len(drawn) > 1 for drawn in curves.tokens_by_source.values())
    if not several and not any(stage.mixture for stage in curves.stages):
        return ""
    by_size = _size_shares(data_dir)
    parts = []
    for stage in curves.stages:
        drawn = curves.tokens_by_source.get(stage.index, {})
        planned = dict(stage.mixture) if stage.mixture else by_size
        if not drawn and not stage.mixture:
            continue
        total = sum(drawn.values())
        names = list(dict.fromkeys([*(planned or {}), *drawn]))
        rows = []
        for name in names:
            plan = "-" if planned is None else f"{100 * planned.get(name, 0.0):.1f}%"
            got = f"{100 * drawn.get(name, 0.0) / total:.1f}%" if total else "-"
            rows.append((f"`{name}`", plan, got, f"{drawn.get(name, 0):,.0f}"))
        how = "stage mixture" if stage.mixture else "sources by size" + ("" if by_size else " (manifest not readable)")
        parts.append(f"### {stage.index + 1}. `{stage.name}` ({how})\n\n"
                     + _table(["source", "planned share", "drawn share", "tokens drawn"], rows))
    if not parts:
        return ""
    return "\n\n".join(["Tokens drawn per source (train records' `tokens_by_source`, all ranks) against the "
                        "stage's planned shares; the draw is random per sequence, so short stages scatter "
                        "around the plan.", *parts])


def _size_shares(data_dir: str | None) -> dict[str, float] | None:
    """{source: share of the train tokens} from the data's manifest, None when it cannot be read."""
    if not data_dir:
        return None
    try:
        sources = manifest_sources(read_manifest(Path(data_dir)))
    except (DataError, OSError, KeyError, TypeError):
        return None
    total = sum(s["train"]["tokens"] for s in sources)
    return {s["name"]: s["train"]["tokens"] / total for s in sources} if total else None


def _checkpoint_table(summary: RunSummary) -> str:
    if not summary.checkpoints:
        return "_No complete checkpoint yet._"
    shown = summary.checkpoints[-MAX_CHECKPOINT_ROWS:]
    rows = [(f"`{c.tag}`", f"{c.step:,}", f"`{c.stage_name}`" + (" (stage end)" if c.stage_complete else ""),
             _count(c.consumed_tokens),
             f"{c.last_validation['loss']:.4f}" if isinstance(c.last_validation.get("loss"), (int, float)) else "-",
             c.saved_at) for c in shown]
    more = len(summary.checkpoints) - len(shown)
    note = f"\n\n_{more} older checkpoint(s) not shown._" if more else ""
    return _table(["tag", "step", "stage", "tokens", "validation loss", "saved at"], rows) + note + \
        f"\n\nIn `{summary.root / 'checkpoints'}`; `roformer export {summary.root} --out DIR` exports the newest."


def _restart_table(summary: RunSummary) -> str:
    """One row per fault `roformer pretrain --max-restarts` met (RUN_DIR/restarts.json, docs/unattended.md)."""
    rows = []
    for r in summary.restarts:
        lost = f"{r.seconds_lost:.1f}" if r.seconds_lost is not None else \
            (f">= {r.stop_seconds + r.backoff_seconds + r.redo_seconds:.1f}" if r.action == "restart" else "-")
        after = (f"{r.world_size}" + (f" (without {', '.join(r.excluded_nodes)})" if r.excluded_nodes else "")
                 if r.world_size else "-")
        rows.append((str(r.attempt), r.action, r.cause, r.node or "?", str(r.failed_at_step),
                     str(r.restarted_from_step), str(r.steps_lost), lost, after, r.time, r.reason or ""))
    restarted = sum(r.action == "restart" for r in summary.restarts)
    known = [r.seconds_lost for r in summary.restarts if r.seconds_lost is not None]
    total = f"; {sum(known):.1f} s lost in all" if known else ""
    return (_table(["#", "action", "cause", "node", "failed at step", "resumed from step", "steps lost",
                    "seconds lost", "world size after", "time", "why not restarted"], rows)
            + f"\n\n{_plural(restarted, 'restart')}{total}. Seconds lost = stopping the job + backoff + the "
              "restart up to its first step + the lost steps trained again; the loss plots mark each fault.")


def guard_events(curves: Curves) -> list[dict]:
    """The numerics guard's triggers and actions (metrics.jsonl `guard` events, launcher/train/guard_actions.py)."""
    return [e for e in curves.events if e.get("event") == "guard"]


def _guard_table(curves: Curves) -> str:
    """One row per trigger of the numerics guard and what it did (docs/unattended.md, "The numerics guard")."""
    rows = []
    for e in guard_events(curves):
        rewound = f"`{e['tag']}` (step {e['to_step']}), {e['skipped_batches']} batches skipped" if e.get("tag") else "-"
        rows.append((str(e.get("step")), e.get("action", "?"), str(e.get("rule", "?")).replace("_", " "),
                     f"{e.get('figure')} {_num(e.get('value'), '{:.5g}')}", _num(e.get("median"), "{:.5g}"),
                     _num(e.get("threshold"), "{:.5g}"), str(e.get("began")), rewound,
                     _num(e.get("seconds"), "{:.2f}")))
    rewinds = sum(e.get("action") == "rewind" for e in guard_events(curves))
    return (_table(["step", "action", "rule", "figure", "window median", "threshold", "flagged since", "rewound to",
                    "rewind seconds"], rows)
            + f"\n\n{_plural(rewinds, 'rewind')}. No checkpoint is written from a flagged step; the loss plots mark "
              "each trigger.")


def _evaluations(summary: RunSummary, plots: list[Path], report_path: Path) -> str:
    parts = []
    mlm = [r for r in summary.evals if r.kind == "mlm"]
    if mlm:
        rows = [(f"`{r.label}`", str(row["seq_len"]), _num(row.get("loss")), _num(row.get("accuracy")),
                 _num(row.get("perplexity"), "{:.2f}"),
                 {True: "yes", False: "no"}.get(row.get("longer_than_trained"), "?"))
                for r in mlm for row in sorted(r.content["results"], key=lambda x: x["seq_len"])]
        parts += ["### eval-mlm", _table(["report", "length", "loss", "accuracy", "perplexity", "longer than trained"],
                                         rows), _figures(plots, report_path, ["eval_mlm.png"])]
    finetune = finetune_rows(summary.evals)
    if finetune:
        rows = [(row["label"].replace("\n", ", "), _pair(row["pretrained"]), _pair(row["random_init"]),
                 _pair(row["majority"]), ", ".join(f"`{s}`" for s in row["source"])) for row in finetune]
        parts += ["### Fine-tuning (test split: accuracy / macro-F1)",
                  _table(["task", "pretrained export", "random-init twin", "majority baseline", "report"], rows),
                  _figures(plots, report_path, ["finetune.png"])]
    errors = [r for r in summary.evals if r.kind == "error"]
    if errors:
        parts.append("Failed evals: " + "; ".join(f"`{r.label}`: {r.content['error']}" for r in errors))
    if summary.unreadable:
        parts.append("Not valid JSON (skipped): " + ", ".join(f"`{name}`" for name in summary.unreadable))
    if not parts:
        return ("_No evaluation report in the run directory yet_ (JSON of `roformer eval-mlm --out` / "
                "`roformer finetune --out` saved in RUN_DIR, or stage-end evals in RUN_DIR/evals/).")
    return "\n\n".join(p for p in parts if p)


def _figures(plots: list[Path], report_path: Path, names: list[str]) -> str:
    by_name = {p.name: p for p in plots}
    return "\n\n".join(f"![{CAPTIONS[n]}]({os.path.relpath(by_name[n], report_path.parent)})"
                       for n in names if n in by_name)


def _table(header: list[str], rows: list[tuple]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _median(values: np.ndarray, fmt: str) -> str:
    finite = values[np.isfinite(values)]
    return fmt.format(float(np.median(finite))) if len(finite) else "-"


def _num(value, fmt: str = "{:.4f}") -> str:
    return fmt.format(value) if isinstance(value, (int, float)) else "-"


def _pair(scores: dict | None) -> str:
    return f"{scores['accuracy']:.4f} / {scores['macro_f1']:.4f}" if scores else "-"


def _span(values: list[int]) -> str:
    """'4', or '4-8' for values that differ (a batch ramp's micro-batches or grad-accums)."""
    return str(values[0]) if min(values) == max(values) else f"{min(values)}-{max(values)}"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _count(value: float) -> str:
    """1234567 -> '1.23 M' (tokens)."""
    for factor, suffix in ((1e9, " G"), (1e6, " M"), (1e3, " k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g}{suffix}"
    return f"{value:.0f}"

"""The reproduction's `documents` part's numbers: its table in results.json (masked-LM loss per view and length,
training tokens/s, the fine-tunes, per variant over seeds) and its section of report.md (runs: documents_part.py)."""
from __future__ import annotations

import json

from launcher.reproduce.documents_part import EVAL_VIEWS, VARIANTS
from launcher.reproduce.run_tables import finetune_table, pretrain_summary
from launcher.reproduce.seed_spread import spread


def documents_table(preset, layout, pretrain: list, finetune: list, evals: list) -> dict:
    """results.json's "documents": per variant its runs' throughput, the loss per view and length, the fine-tunes."""
    part = preset.documents
    names = {part.run_name(v, s): v for v in VARIANTS for s in part.seeds}
    table: dict = {"budget": part.budget, "variants": {}, "unfinished": []}

    def cell(variant: str) -> dict:
        return table["variants"].setdefault(variant, {"runs": {}, "loss": {}, "seeds": {}})

    for run in pretrain:
        if run.name not in names:
            continue
        summary = pretrain_summary(run, layout)
        if not summary["finished"]:
            table["unfinished"].append(run.name)
            continue
        kept = ("steps", "median_tokens_per_s", "train_seconds", "final_valid_loss")
        cell(names[run.name])["runs"][run.name] = {key: summary[key] for key in kept}
    for run in evals:
        path = layout.eval_report(run)
        if not path.is_file():
            continue
        report = json.loads(path.read_text(encoding="utf-8"))
        cell(run.variant)["seeds"].setdefault(run.attention, {})[str(run.seed)] = {
            str(r["seq_len"]): r["loss"] for r in report["results"]}
    for figures in table["variants"].values():
        figures["median_tokens_per_s"] = spread([r["median_tokens_per_s"] for r in figures["runs"].values()
                                                 if r["median_tokens_per_s"]])
        for view, seeds in figures["seeds"].items():
            lengths = sorted({int(n) for seed in seeds.values() for n in seed})
            figures["loss"][view] = {str(n): spread([s[str(n)] for s in seeds.values() if str(n) in s])
                                     for n in lengths}
    table["finetune"] = finetune_table(finetune, layout, key=lambda r: (r.task, names.get(r.pretrain, r.pretrain)))
    return table


def better(ours: dict, theirs: dict, direction: str) -> str:
    """Is `ours` better (`direction`: "lower" or "higher") than `theirs`: on every seed, on the mean only, or not."""
    if not (ours.get("n") and theirs.get("n")):
        return "n/a"
    if direction == "lower":
        every, mean = ours["max"] < theirs["min"], ours["mean"] < theirs["mean"]
    else:
        every, mean = ours["min"] > theirs["max"], ours["mean"] > theirs["mean"]
    return "yes, beyond the seed spread" if every else "on the mean only (the seed ranges overlap)" if mean else "no"


def verdicts(table: dict) -> list[str]:
    """One line per comparison of `document` with `sequence`: loss scored per document, each task, speed."""
    variants = table["variants"]
    doc, seq = variants.get("document"), variants.get("sequence")
    if not (doc and seq):
        return []
    lines = []
    for length, stats in doc["loss"].get("document", {}).items():
        theirs = seq["loss"].get("document", {}).get(length, {"n": 0})
        if stats.get("n") and theirs.get("n"):
            lines.append(f"- loss scored per document at {length}: document {stats['mean']:.3f} vs sequence "
                         f"{theirs['mean']:.3f}; document lower: {better(stats, theirs, 'lower')}.")
    for task, cells in table["finetune"].items():
        ours, theirs = cells.get("document", {}).get("accuracy"), cells.get("sequence", {}).get("accuracy")
        if ours and theirs and ours.get("n") and theirs.get("n"):
            lines.append(f"- {task} test accuracy: document {ours['mean']:.3f} vs sequence {theirs['mean']:.3f}; "
                         f"document higher: {better(ours, theirs, 'higher')}.")
    ours, theirs = doc["median_tokens_per_s"], seq["median_tokens_per_s"]
    if ours.get("n") and theirs.get("n"):
        lines.append(f"- training tokens/s (median step of each run): document {ours['mean']:,.0f} vs sequence "
                     f"{theirs['mean']:,.0f} ({ours['mean'] / theirs['mean']:.2f}x).")
    return lines


def documents_section(table: dict, fmt) -> list[str]:
    lines = ["## Packed documents: seen whole or apart (issue 50)", "",
             "The RoPE ablation run (sequence: every token sees its whole packed sequence, today's default) against "
             "the same run with `data.attention: document` (a token sees only its own document), with positions "
             "running on or restarting at each document; same data, order, schedule and seeds (equal tokens). "
             "Masked-LM loss of the last checkpoint at the fixed 15% rate on the same validation tokens, scored "
             "with each document alone (`eval-mlm --attention document`) and as packed; mean (min-max, n) over "
             "pretraining seeds, lower is better. With RoPE, restarting positions inside document attention leaves "
             "every attention score as it is (they depend on m - n only): the two document variants differ by "
             "rounding alone.", "", "![documents](documents.png)", ""]
    views = [(view, length) for view in EVAL_VIEWS for length in sorted(
        {int(n) for cell in table["variants"].values() for n in cell["loss"].get(view, {})})]
    if views:
        lines += ["| variant | " + " | ".join(f"loss at {n}, {view} view" for view, n in views)
                  + " | training tokens/s |", "|---|" + "---|" * (len(views) + 1)]
        for variant, label in VARIANTS.items():
            cell = table["variants"].get(variant)
            if cell:
                lines.append(f"| {label} | " + " | ".join(fmt(cell["loss"].get(view, {}).get(str(n), {"n": 0}))
                                                          for view, n in views)
                             + f" | {fmt(cell['median_tokens_per_s'], digits=0)} |")
        lines.append("")
    if table["finetune"]:
        lines += [f"Fine-tuned at {table['budget']} labels (the downstream part's protocols), test accuracy over "
                  "(pretraining seed, fine-tuning seed) pairs:", "",
                  "| variant | " + " | ".join(table["finetune"]) + " |", "|---|" + "---|" * len(table["finetune"])]
        for variant, label in VARIANTS.items():
            cells = [table["finetune"][task].get(variant, {}).get("accuracy", {"n": 0}) for task in table["finetune"]]
            if any(cell.get("n") for cell in cells):
                lines.append(f"| {label} | " + " | ".join(fmt(cell) for cell in cells) + " |")
        lines.append("")
    if table["unfinished"]:
        lines += [f"Not finished yet (left out above): {', '.join(table['unfinished'])}.", ""]
    return lines + verdicts(table) + [""]

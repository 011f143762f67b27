"""The reproduction's `from-bert` part's numbers: its table in results.json (loss per length, the steps
the converted model needs to get back to the BERT's loss, the fine-tunes) and its section of report.md
(its runs: from_bert_part.py)."""
from __future__ import annotations

import json

from launcher.reproduce.from_bert_part import BASE, VARIANTS, schedule_stages
from launcher.reproduce.run_tables import comparison, finetune_table
from launcher.reproduce.seed_spread import spread


def recovery_step(curve: list, target: float | None) -> int | None:
    """First validation step of `curve` ([step, loss, accuracy], ...) at or below `target`; None: never."""
    if target is None:
        return None
    return next((step for step, loss, *_ in curve if loss <= target), None)


def from_bert_table(preset, layout, pretrain: list, finetune: list, evals: list) -> dict:
    """results.json's "from-bert": per variant the loss per length, the recovery steps of (a), the fine-tunes."""
    part = preset.from_bert
    names = {part.run_name(v, s): v for v in (BASE, *VARIANTS) for s in part.seeds}
    groups = comparison([r for r in pretrain if r.name in names], layout)
    by_variant: dict = {}
    for group in groups.values():
        for name, summary in group["runs"].items():
            by_variant.setdefault(names[name], {})[name] = summary
    table: dict = {"stage": dict(part.stage), "base_steps": sum(s["steps"] for s in schedule_stages(preset.ablation_schedule)),
                   "table_positions": preset.absolute_positions, "variants": {}, "recovery": {}}
    for run in evals:
        path = layout.eval_report(run)
        if not path.is_file():
            continue
        report = json.loads(path.read_text(encoding="utf-8"))
        cell = table["variants"].setdefault(run.variant, {"seeds": {}})
        cell["seeds"][str(run.seed)] = {str(r["seq_len"]): r["loss"] for r in report["results"]}
    for cell in table["variants"].values():
        lengths = sorted({int(n) for seed in cell["seeds"].values() for n in seed})
        cell["loss"] = {str(n): spread([s[str(n)] for s in cell["seeds"].values() if str(n) in s]) for n in lengths}
    for seed in part.seeds:
        base = by_variant.get(BASE, {}).get(part.run_name(BASE, seed))
        converted = by_variant.get("converted", {}).get(part.run_name("converted", seed))
        if base and converted:
            table["recovery"][str(seed)] = {
                "target_valid_loss": base["final_valid_loss"],
                "steps": recovery_step(converted["valid_curve"], base["final_valid_loss"]),
                "first_valid": converted["valid_curve"][0] if converted["valid_curve"] else None,
                "of_steps": converted["steps"]}
    table["finetune"] = finetune_table(finetune, layout, key=lambda r: (names.get(r.pretrain, r.pretrain),))
    table["curves"] = _curves(by_variant, table["base_steps"])
    return table


def _curves(by_variant: dict, base_steps: int) -> dict:
    """Groups for claim_plots.loss_curves on one step axis: the continuations start at the learned run's end."""
    groups = {}
    for variant, label in ((BASE, "learned (the BERT)"), *VARIANTS.items()):
        runs = by_variant.get(variant, {})
        offset = base_steps if variant in ("converted", "continued-bert") else 0
        shifted = {name: {**s, "valid_curve": [[step + offset, *rest] for step, *rest in s["valid_curve"]]}
                   for name, s in runs.items()}
        finals = [s["final_valid_loss"] for s in runs.values() if s["final_valid_loss"] is not None]
        if shifted:
            groups[label] = {"runs": shifted, "final_valid_loss": spread(finals)}
    return groups


def from_bert_section(table: dict, fmt) -> list[str]:
    stage, n, table_len = table["stage"], table["base_steps"], table["table_positions"]
    lines = ["## From BERT: a learned-position model continued as RoFormer (paper section 4.5.2)", "",
             f"A learned-position model (the BERT: {n} steps of the ablation schedule, a {table_len}-row position "
             f"table) continued {stage['steps']} steps ({stage['max_seq_len']} x {stage['global_batch_size']}) "
             f"(a) converted to RoPE (its table dropped) and (b) as it is, against (c) RoPE from scratch for "
             f"{n} + {stage['steps']} steps. Masked-LM loss at the fixed 15% rate on the same validation tokens "
             "(mean (min-max, n) over pretraining seeds; lower is better; a learned model cannot read past its "
             "table: n/a).", "", "![from-bert](from_bert.png)", ""]
    lengths = sorted({int(k) for cell in table["variants"].values() for k in cell["loss"]})
    if lengths:
        lines += ["| model | " + " | ".join(f"loss at {k}" for k in lengths) + " |",
                  "|---|" + "---|" * len(lengths)]
        for variant, label in ((BASE, "learned (the BERT, before continuing)"), *VARIANTS.items()):
            cell = table["variants"].get(variant)
            if cell:
                lines.append(f"| {label} | " + " | ".join(fmt(cell["loss"].get(str(k), {"n": 0})) for k in lengths)
                             + " |")
        lines.append("")
    for seed, rec in table["recovery"].items():
        first = rec["first_valid"]
        got = (f"recovered it after {rec['steps']} steps" if rec["steps"] is not None
               else f"did NOT recover it within its {rec['of_steps']} steps")
        lines.append(f"- seed {seed}: the learned model's last validation loss {rec['target_valid_loss']:.3f}; "
                     f"converted to RoPE, the first validation (step {first[0] if first else '?'}) was "
                     f"{first[1] if first else float('nan'):.3f}, and it {got}.")
    if table["recovery"]:
        lines.append("")
    if table["finetune"]:
        lines += ["| model | inews test accuracy | macro-F1 | labels |", "|---|---|---|---|"]
        for variant, label in VARIANTS.items():
            cell = table["finetune"].get(variant)
            if cell:
                lines.append(f"| {label} | {fmt(cell['accuracy'])} | {fmt(cell['macro_f1'])} | "
                             f"{cell['train_examples']} |")
        lines.append("")
    return lines

"""OUT/report/: report.md (the claims, each with its numbers and a verdict), the PNGs, results.json."""
from __future__ import annotations

from pathlib import Path

from launcher.common.io import atomic_write_json, atomic_write_text
from launcher.outputs.output_paths import REPORT_TITLES
from launcher.reproduce import claim_plots as plots
from launcher.reproduce.documents_results import documents_section
from launcher.reproduce.from_bert_results import from_bert_section
from launcher.reproduce.retrieval_part import retrieval_section
from launcher.reproduce.schedules_results import schedules_section


def _fmt(stats: dict, digits: int = 3, scale: float = 1.0) -> str:
    if not stats.get("n"):
        return "n/a"
    m, lo, hi = (stats[k] * scale for k in ("mean", "min", "max"))
    return f"{m:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f}, n={stats['n']})"


def _comparison_section(title: str, claim: str, groups: dict, better: str, others: list[str], picture: str) -> list[str]:
    lines = [f"## {title}", "", claim, "", f"![{title}]({picture})", "",
             "| variant | final validation loss: mean (min-max, seeds) | final MLM accuracy | median tokens/s |",
             "|---|---|---|---|"]
    for group, data in groups.items():
        speeds = [r["median_tokens_per_s"] for r in data["runs"].values() if r["median_tokens_per_s"]]
        speed = f"{sum(speeds) / len(speeds):,.0f}" if speeds else "n/a"
        lines.append(f"| {group} | {_fmt(data['final_valid_loss'])} | {_fmt(data['final_valid_accuracy'])} | {speed} |")
    lines.append("")
    unfinished = [name for data in groups.values() for name in data.get("unfinished", [])]
    if unfinished:
        lines += [f"Not finished yet (left out above): {', '.join(unfinished)}.", ""]
    lines += [line for other in others if (line := _verdict(groups, better, other))]
    return lines + [""]


def _verdict(groups: dict, better: str, other: str) -> str | None:
    """One line: does `better` end below `other` (every seed, on the mean only, or not)? None without both."""
    best = groups.get(better, {}).get("final_valid_loss", {})
    theirs = groups.get(other, {}).get("final_valid_loss", {})
    if not (best.get("n") and theirs.get("n")):
        return None
    gap = theirs["mean"] - best["mean"]
    separated = best["max"] < theirs["min"]
    verdict = ("holds: every seed of the first is below every seed of the second" if separated else
               "holds on the mean only (the seed ranges overlap)" if gap > 0 else "does NOT hold here")
    return (f"- {better} vs {other}: final loss {best['mean']:.3f} vs {theirs['mean']:.3f} "
            f"(gap {gap:+.3f}); the claim {verdict}.")


def _shipped_recipe_section(table: dict) -> list[str]:
    """The three-phase recipe against recipe.yaml (equal tokens) and the random-init twin, per task."""
    losses = {name: run.get("final_valid_loss") for name, run in table.get("pretraining", {}).items()}
    loss_text = ", ".join(f"{name} {loss:.3f}" for name, loss in losses.items() if loss is not None) or "n/a"
    lines = ["## The shipped three-phase recipe against the recipe (equal tokens)", "",
             "`configs/reproduce/recipe_three_phase.yaml`: the recipe's model, corpus, lengths, batches and steps, "
             "trained at 30% masked and RoPE base 2500, then 512 tokens at 10000, then a WSD (1-sqrt) decay at 15%. "
             f"Final validation loss at the fixed 15% mask rate on the same tokens: {loss_text}. Test accuracy at "
             f"{table['budget']} labels, mean (min-max, n) over fine-tuning seeds.", "",
             "![The shipped three-phase recipe against the recipe](recipe_comparison.png)", "",
             "| task | three-phase | recipe | random-init twin | three-phase minus recipe (points) |",
             "|---|---|---|---|---|"]
    for task, cells in table["tasks"].items():
        gap = cells.get("three_phase_minus_recipe_points")
        lines.append(f"| {task} | " + " | ".join(_fmt(cells.get(name, {}).get("accuracy", {})) for name in
                                                 ("three-phase", "recipe", "random-init twin"))
                     + f" | {'n/a' if gap is None else f'{gap:+.1f}'} |")
    return lines + [""]


def _recipes_section(groups: dict) -> list[str]:
    """The recipes part: WSD vs linear decay and the annealed vs the fixed mask rate, on one picture."""
    claim = ("Claims: at equal steps a warmup-stable-decay learning rate (1-sqrt over the last stage) "
             "ends at least as low as the linear decay, and a mask rate annealed per stage (30% -> 15%) ends lower "
             "than 15% throughout. Variants: `linear` = the RoPE ablation run (linear decay, 15% masked), `wsd` = "
             "the same with optimizer.decay wsd, `mask-annealed` = the same with a mask_prob per stage. Every "
             "validation masks at the run config's fixed 15% on the same held-out tokens, so the losses compare "
             "(a loss at another mask rate would not).")
    lines = _comparison_section("Recipe fields: WSD and an annealed mask rate", claim, groups, "wsd", ["linear"],
                                "recipes.png")
    annealed = _verdict(groups, "mask-annealed", "linear")
    if annealed:
        lines.insert(len(lines) - 1, annealed)
    return lines


def _downstream_section(table: dict) -> list[str]:
    lines = ["## Downstream value: the export against its random-init twin", "",
             "Same architecture, tokenizer and fine-tuning protocol; the twin's weights are freshly initialised. "
             "Test accuracy, mean (min-max, n) over every (pretraining seed, fine-tuning seed) pair; the last column "
             "gives the gain of each pretraining seed's export alone. Hyper-parameters were chosen on dev.", "",
             "![downstream](downstream.png)", "",
             "| task | labels | pretrained export | random-init twin | gain (points) | gain per pretraining run | "
             "majority baseline |", "|---|---|---|---|---|---|---|"]
    for task, budgets in table.items():
        for budget, cell in budgets.items():
            pre, rnd = cell.get("pretrained", {}), cell.get("random", {})
            base = (pre or rnd).get("majority_baseline_accuracy")
            gain = f"{cell['gain_points']:+.1f}" if "gain_points" in cell else "n/a"
            by_run = cell.get("by_pretraining_run", {})
            per_run = ", ".join(f"{name} {run['gain_points']:+.1f} (n={run['accuracy']['n']})"
                                for name, run in by_run.items()) or "n/a"
            examples = (pre or rnd).get("train_examples")
            lines.append(f"| {task} | {budget} ({examples}) | {_fmt(pre.get('accuracy', {}))} | "
                         f"{_fmt(rnd.get('accuracy', {}))} | {gain} | {per_run} | {base:.3f} |")
    return lines + [""]


def _extension_section(ext: dict) -> list[str]:
    variants = ext["variants"]
    lengths = sorted({int(n) for v in variants.values() for n in v["loss"]})
    stages = ext["stages"]["same-theta"]
    base = " -> ".join(f"{s['max_seq_len']} x {s['global_batch_size']} for {s['steps']}" for s in stages[:-1])
    last = stages[-1]
    lines = ["## Context extension as a stage field (RoPE base raised in the last stage)", "",
             f"One RoPE model per seed pretrained {base} steps, then a last stage of {last['steps']} steps at "
             f"{last['max_seq_len']} x {last['global_batch_size']} with (a) the same base (same-theta) or (b) a "
             f"larger one (larger-theta); (c) no-extension is run (a)'s checkpoint before that stage "
             f"({ext['base_end_tag']}). Masked-LM validation loss on the same text at each length "
             "(mean (min-max, n) over seeds; lower is better).", "", "![extension](extension.png)", "",
             "| variant | rope_theta | longest trained | " + " | ".join(f"loss @ {n}" for n in lengths) + " |",
             "|---|---|---|" + "---|" * len(lengths)]
    for name in ("no-extension", "same-theta", "larger-theta"):
        if name in variants:
            v = variants[name]
            lines.append(f"| {name} | {v['rope_theta']:g} | {v['trained_max_seq_len']} | "
                         + " | ".join(_fmt(v["loss"].get(str(n), {})) for n in lengths) + " |")
    lines.append("")
    longest = str(lengths[-1]) if lengths else None
    pairs = [("larger-theta", "same-theta"), ("same-theta", "no-extension"), ("larger-theta", "no-extension")]
    for better, other in pairs:
        a, b = (variants.get(x, {}).get("loss", {}).get(longest, {}) for x in (better, other))
        if a.get("n") and b.get("n"):
            verdict = ("NOT lower" if a["mean"] >= b["mean"] else
                       "lower; one seed, no spread measured" if min(a["n"], b["n"]) < 2 else
                       "every seed below every seed" if a["max"] < b["min"] else "lower on the mean; seed ranges overlap")
            lines.append(f"- at {longest} tokens, {better} vs {other}: {a['mean']:.3f} vs {b['mean']:.3f} ({verdict}).")
    return lines + [""]


def _lengths_section(table: dict, trained: int | None) -> list[str]:
    lines = ["## Long documents: inews at several fine-tuning lengths (paper Table 5 analog)", "",
             f"The RoPE export (longest pretrained length: {trained}) fine-tuned with the same protocol at each "
             "maximum length; lengths beyond the pretrained one rely on RoPE having no position table.", "",
             "![lengths](table5_lengths.png)", "",
             "| max length | test accuracy | test macro-F1 | truncated test docs |", "|---|---|---|---|"]
    for length in sorted(table, key=int):
        cell = table[length]
        lines.append(f"| {length} | {_fmt(cell['accuracy'])} | {_fmt(cell['macro_f1'])} | "
                     f"{cell['truncated_share_test']:.0%} |")
    lengths = sorted(table, key=int)
    if len(lengths) > 1:
        short, long = table[lengths[0]]["accuracy"], table[lengths[-1]]["accuracy"]
        if short.get("n") and long.get("n"):
            beyond = long["min"] > short["max"] or long["max"] < short["min"]
            lines += ["", f"- {lengths[0]} -> {lengths[-1]}: accuracy {short['mean']:.3f} -> {long['mean']:.3f} "
                      f"({100 * (long['mean'] - short['mean']):+.1f} points; n = {short['n']} / {long['n']} fine-tuning "
                      f"seeds): " + ("one seed: the seed spread is not measured." if min(short["n"], long["n"]) < 2
                                     else "beyond the seed spread (the ranges do not overlap)." if beyond
                                     else "within the seed spread (the ranges overlap).")]
    return lines + [""]


# part -> (section title, plot title, the paper's claim, variant claimed better, the others, picture)
COMPARISONS = {
    "encodings": ("Fig. 2 analog: position encodings",
                  "MLM validation loss: RoPE vs absolute positions (paper Fig. 2 analog)",
                  "Claim: RoFormer (RoPE) converges faster than the same encoder with absolute position embeddings "
                  "(sinusoidal as in BERT's Transformer, or learned as in BERT).",
                  "rope", ["sinusoidal", "learned", "sinusoidal_unscaled"], "fig2_encodings.png"),
    "linear": ("Linear attention with RoPE (eq. 19)",
               "Linear attention (eq. 19): RoPE vs sinusoidal absolute positions",
               "Claim: RoPE also improves linear attention (it multiplies the kernelised queries and keys, so the "
               "norm-preserving rotation keeps the attention weights non-negative).",
               "linear+rope", ["linear+sinusoidal", "linear+sinusoidal_unscaled"], "linear_attention.png"),
}


def write_report(results: dict, out: Path, header: list[str]) -> Path:
    """report.md + PNGs + results.json in `out`; returns the report's path."""
    out.mkdir(parents=True, exist_ok=True)
    lines = [REPORT_TITLES[1], "", *header, ""]
    for part, (title, plot_title, claim, better, others, picture) in COMPARISONS.items():
        if part in results:
            plots.loss_curves(results[part], plot_title, out / picture)
            lines += _comparison_section(title, claim, results[part], better, others, picture)
    recipe = results.get("recipe")
    if recipe and not recipe.get("finished", True):  # planned (e.g. by another part) but not run (yet)
        recipe = None
    trained = max((s["max_seq_len"] for s in recipe["stages"]), default=None) if recipe else None
    if recipe:
        lines += ["## The recipe's pretraining run", "",
                  f"{recipe['steps']} steps in {recipe['train_seconds'] / 60:.1f} min of training steps; final "
                  f"validation loss {recipe['final_valid_loss']:.3f}, MLM accuracy {recipe['final_valid_accuracy']:.3f}; "
                  f"stages: " + ", ".join(f"{s['name']} {s['max_seq_len']} x {s['global_batch_size']} for {s['steps']}"
                                          for s in recipe["stages"]) + ".", ""]
    if "lengths" in results and results["lengths"]:
        plots.lengths(results["lengths"], trained, out / "table5_lengths.png")
        lines += _lengths_section(results["lengths"], trained)
    if "downstream" in results and results["downstream"]:
        plots.downstream(results["downstream"], out / "downstream.png")
        lines += _downstream_section(results["downstream"])
    if results.get("extension", {}).get("variants"):
        plots.extension(results["extension"], out / "extension.png")
        lines += _extension_section(results["extension"])
    if results.get("recipes"):
        plots.loss_curves(results["recipes"], "MLM validation loss at a fixed 15% mask rate: WSD and an annealed mask rate",
                          out / "recipes.png")
        lines += _recipes_section(results["recipes"])
    if results.get("recipe_comparison", {}).get("tasks"):
        plots.recipe_comparison(results["recipe_comparison"], out / "recipe_comparison.png")
        lines += _shipped_recipe_section(results["recipe_comparison"])
    if results.get("retrieval"):
        lines += retrieval_section(results["retrieval"], _fmt)
    if results.get("from-bert"):
        plots.loss_curves(results["from-bert"]["curves"], "MLM validation loss: a BERT converted to RoPE, continued "
                          "as BERT, and RoPE from scratch", out / "from_bert.png")
        lines += from_bert_section(results["from-bert"], _fmt)
    if results.get("documents", {}).get("variants"):
        plots.documents(results["documents"], out / "documents.png")
        lines += documents_section(results["documents"], _fmt)
    if results.get("schedules", {}).get("variants"):
        plots.schedules(results["schedules"], out / "schedules.png")
        lines += schedules_section(results["schedules"], _fmt)
    if results.get("sources"):
        lines += ["## Where each part's numbers come from", "",
                  "| part | source |", "|---|---|", *[f"| {part} | {label} |" for part, label in results["sources"].items()],
                  ""]
    atomic_write_json(out / "results.json", results)
    path = out / "report.md"
    atomic_write_text(path, "\n".join(lines).rstrip() + "\n")
    return path

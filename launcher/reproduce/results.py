"""Every number of a reproduction, gathered from its run directories and fine-tune reports.

`collect(...)` returns OUT/report/results.json's dict: validation curves and final losses, fine-tune
scores, extension losses, each over seeds as mean, min, max and n (with two or three seeds a standard
deviation says little). `merge(results, priors)` fills what this output directory has not run from earlier
results.json files and records each part's source.
"""
from __future__ import annotations

import dataclasses
import json

from launcher.reproduce.documents_results import documents_table
from launcher.reproduce.from_bert_results import from_bert_table
from launcher.reproduce.job_runner import Layout
from launcher.reproduce.reproduction_plan import PARTS, EvalRun, Preset, PretrainRun
from launcher.reproduce.retrieval_part import retrieval_table
from launcher.reproduce.run_tables import comparison, finetune_table, pretrain_summary
from launcher.reproduce.schedules_results import schedules_table
from launcher.reproduce.seed_spread import spread


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
    recipe = {r.name: r for r in pretrain if r.name in preset.recipe_runs}
    if preset.recipe_run in recipe:
        results["recipe"] = pretrain_summary(recipe[preset.recipe_run], layout)
        results["recipe_runs"] = {name: {"seed": run.seed, **pretrain_summary(run, layout)}
                                  for name, run in recipe.items()}
    if "downstream" in parts:
        downstream = [r for r in finetune if r.part == "downstream"]
        # "pretrained" pools every (pretraining seed, fine-tuning seed) pair; by_pretraining_run
        # keeps each pretraining seed apart, so the gain's spread over pretraining seeds shows.
        table = finetune_table(downstream, layout, key=lambda r: (r.task, budget_label(r.budget), r.init))
        per_run = finetune_table([r for r in downstream if r.init == "pretrained"], layout,
                                 key=lambda r: (r.task, budget_label(r.budget), r.pretrain))
        for task_name, task in table.items():
            for budget, cell in task.items():
                if "pretrained" in cell and "random" in cell and cell["pretrained"]["accuracy"]["n"]:
                    twin = cell["random"]["accuracy"]["mean"]
                    cell["gain_points"] = 100 * (cell["pretrained"]["accuracy"]["mean"] - twin)
                    runs = per_run.get(task_name, {}).get(budget, {})
                    cell["by_pretraining_run"] = {
                        name: {"accuracy": run["accuracy"], "gain_points": 100 * (run["accuracy"]["mean"] - twin)}
                        for name, run in runs.items()}
        results["downstream"] = table
    if "lengths" in parts:
        results["lengths"] = finetune_table(preset.lengths_finetunes(), layout,
                                            key=lambda r: (str(r.max_length),))
    if "extension" in parts and preset.extension is not None:
        results["extension"] = extension_table([r for r in preset.eval_runs(parts) if r.part == "extension"], layout,
                                               preset)
    if "recipes" in parts and preset.recipes is not None:
        results["recipes"] = recipe_comparison(pretrain, preset, layout)
    if preset.compares_recipe(parts):
        results["recipe_comparison"] = shipped_recipe_table(preset, layout)
    if "retrieval" in parts:
        results["retrieval"] = retrieval_table([r for r in finetune if r.part == "retrieval"], layout.finetune_report)
    if "from-bert" in parts and preset.from_bert is not None:
        results["from-bert"] = from_bert_table(preset, layout, pretrain, [r for r in finetune if r.part == "from-bert"],
                                               [r for r in preset.eval_runs(parts) if r.part == "from-bert"])
    if "documents" in parts and preset.documents is not None:
        results["documents"] = documents_table(preset, layout, pretrain, [r for r in finetune if r.part == "documents"],
                                               [r for r in preset.eval_runs(parts) if r.part == "documents"])
    if "schedules" in parts and preset.schedules is not None:
        results["schedules"] = schedules_table(preset, layout, pretrain, [r for r in finetune if r.part == "schedules"],
                                               [r for r in preset.eval_runs(parts) if r.part == "schedules"])
    return results


def shipped_recipe_table(preset: Preset, layout: Layout) -> dict:
    """The three-phase run against the recipe run and the twin: fine-tune figures per task and the two
    pretraining runs' summaries (their validation masks 15% on the same tokens: comparable)."""
    three_phase = preset.recipe_comparison.name
    label = {three_phase: "three-phase", preset.recipe_run: "recipe"}
    finetunes = preset.recipe_comparison_finetunes(("recipes",))
    table = finetune_table(finetunes, layout, key=lambda r: (r.task, label[r.pretrain] if r.init == "pretrained"
                                                             else "random-init twin"))
    for cells in table.values():
        if "three-phase" in cells and "recipe" in cells:
            cells["three_phase_minus_recipe_points"] = 100 * (cells["three-phase"]["accuracy"]["mean"]
                                                              - cells["recipe"]["accuracy"]["mean"])
    runs = {r.name: r for r in preset.pretrain_runs(("recipes",)) if r.name in label}
    return {"budget": preset.recipe_comparison.budget, "tasks": table,
            "pretraining": {label[name]: pretrain_summary(run, layout) for name, run in runs.items()}}


RECIPE_BASELINE = "linear"
"""The recipes part's name for the RoPE ablation run it compares against (linear decay, 15% throughout)."""


def recipe_comparison(pretrain: list[PretrainRun], preset: Preset, layout: Layout) -> dict:
    """The recipes part's groups: the RoPE ablation runs (as "linear"), "wsd" and "mask-annealed"."""
    baseline = {f"rope-s{seed}" for seed in preset.recipes.seeds}
    runs = [dataclasses.replace(r, group=RECIPE_BASELINE) for r in pretrain if r.name in baseline]
    return comparison(runs + [r for r in pretrain if r.group in ("wsd", "mask-annealed")], layout)


def extension_table(runs: list[EvalRun], layout: Layout, preset: Preset) -> dict:
    """Per variant: the RoPE base, each seed's loss per length, and the loss spread per length."""
    ext = preset.extension
    table: dict = {"stages": {v: list(ext.schedule(v)) for v in ("same-theta", "larger-theta")},
                   "base_end_tag": ext.base_end_tag, "variants": {}}
    for run in runs:
        path = layout.eval_report(run)
        if not path.is_file():
            continue
        report = json.loads(path.read_text(encoding="utf-8"))
        variant = table["variants"].setdefault(run.variant, {"rope_theta": report["rope_theta"], "seeds": {}})
        variant["trained_max_seq_len"] = report["trained_max_seq_len"]
        variant["seeds"][str(run.seed)] = {str(r["seq_len"]): {"loss": r["loss"], "accuracy": r["accuracy"]}
                                           for r in report["results"]}
    for variant in table["variants"].values():
        lengths = sorted({int(n) for seed in variant["seeds"].values() for n in seed})
        variant["loss"] = {str(n): spread([seed[str(n)]["loss"] for seed in variant["seeds"].values()
                                           if str(n) in seed]) for n in lengths}
        variant["accuracy"] = {str(n): spread([seed[str(n)]["accuracy"] for seed in variant["seeds"].values()
                                               if str(n) in seed]) for n in lengths}
    return table


COMPARED_PARTS = ("encodings", "linear", "recipes")
"""Parts whose results are comparison groups of pretraining runs (merged group by group)."""


def _has_data(part: str, value) -> bool:
    if part in COMPARED_PARTS:
        return any(group.get("runs") for group in value.values())
    if part == "extension":
        return bool(value.get("variants"))
    if part == "recipe":
        return bool(value.get("finished"))
    if part == "recipe_runs":
        return any(run.get("finished") for run in value.values())
    if part == "recipe_comparison":
        return bool(value.get("tasks"))
    if part == "from-bert":
        return bool(value.get("variants") or value.get("recovery") or value.get("finetune"))
    if part in ("documents", "schedules"):
        return bool(value.get("variants"))
    return bool(value)


GROUP_ORDER = ("rope", "learned", "sinusoidal", "sinusoidal_unscaled",
               "linear+rope", "linear+sinusoidal", "linear+sinusoidal_unscaled", RECIPE_BASELINE, "wsd", "mask-annealed")
MERGED_PARTS = ("encodings", "linear", "recipe", "recipe_runs", "lengths", "downstream", "extension", "recipes",
                "recipe_comparison", "retrieval", "from-bert", "documents", "schedules")


def merge(results: dict, priors: list[tuple[str, dict]], current: str) -> dict:
    """`results` completed from earlier results.json files (label, content), first prior first.

    Comparison parts merge per group (a group with a finished run here wins); the other parts are
    taken whole from the first source that has them. results["sources"] maps each part (or
    "part/group") to the label of where its numbers come from."""
    merged = dict(results)
    sources: dict[str, str] = {}
    for part in MERGED_PARTS:
        candidates = [(current, results.get(part))] + [(label, prior.get(part)) for label, prior in priors]
        candidates = [(label, value) for label, value in candidates if value and _has_data(part, value)]
        if not candidates:
            merged.pop(part, None)
            continue
        if part in COMPARED_PARTS:
            groups: dict = {}
            for label, value in candidates:
                for name, group in value.items():
                    if name not in groups and group.get("runs"):
                        groups[name] = group
                        sources[f"{part}/{name}"] = label
            order = {name: i for i, name in enumerate(GROUP_ORDER)}
            merged[part] = dict(sorted(groups.items(), key=lambda item: order.get(item[0], len(order))))
        else:
            sources[part], merged[part] = candidates[0]
    merged["parts"] = [p for p in PARTS if p in merged]
    merged["sources"] = sources
    return merged

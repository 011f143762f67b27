"""The reproduction's `from-bert` part: a BERT continued as RoFormer (paper section 4.5.2), in small.

The encodings part's learned-position run, exported as a BERT, continued (a) converted to RoPE and (b) as
it is, against (c) RoPE from scratch for as many steps in all; compared on masked-LM loss at a short and a
longer-than-the-table length, the steps (a) needs to get back to the BERT's loss, and inews fine-tuning
(docs/reproduction/README.md).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

VARIANTS = {"converted": "(a) BERT converted to RoPE, continued", "continued-bert": "(b) BERT continued as BERT",
            "rope-scratch": "(c) RoPE from scratch, N + M steps"}
BASE = "learned-base"
"""The evaluation name of the learned-position model every variant starts from (its last checkpoint)."""


@dataclass(frozen=True)
class FromBert:
    """The from-bert part's sizes."""

    stage: dict
    """The continuation stage (M steps; schedule-file entry), at the ablation schedule's last length, so
    that the runs' own validation compares with the learned model's last one."""
    seeds: tuple[int, ...]
    """Pretraining seeds: the learned run of each, its two continuations and a RoPE run from scratch."""
    eval_lens: tuple[int, ...]
    """Masked-LM evaluation lengths; the ones longer than the learned table are evaluated for RoPE models only."""
    budget: int
    """inews labelled examples of the fine-tunes."""
    finetune_args: tuple[str, ...]
    eval_tokens: int = 32768
    task: str = "inews"
    max_length: int = 128
    continue_overrides: tuple[str, ...] = ()
    """`--set` items of (a) and (b) only (e.g. validation more often, to see the recovery step)."""

    def run_name(self, variant: str, seed: int) -> str:
        return {"converted": f"from-bert-rope-s{seed}", "continued-bert": f"from-bert-learned-s{seed}",
                "rope-scratch": f"rope-long-s{seed}", BASE: f"learned-s{seed}"}[variant]


def _stages(schedule_file: Path) -> tuple[dict, ...]:
    import yaml

    return tuple(yaml.safe_load(schedule_file.read_text(encoding="utf-8"))["stages"])


def pretrain_runs(preset, run_type, planned: set[str]) -> list:
    """The learned runs (unless the encodings part plans them: the same runs), (a), (b) and (c) per seed."""
    part = preset.from_bert
    base_stages = _stages(preset.ablation_schedule)
    table = f"model.max_position_embeddings={preset.absolute_positions}"
    learned = (*preset.overrides, "model.position_encoding=learned", "model.attention=softmax", table)
    rope = (*preset.overrides, "model.position_encoding=rope", "model.attention=softmax")
    runs = []
    for seed in part.seeds:
        base = part.run_name(BASE, seed)
        if base not in planned:  # the encodings part's learned run of this seed, overrides in its order
            runs.append(run_type(name=base, config=preset.ablation_config, group="learned", seed=seed,
                                 overrides=(*learned, f"seed={seed}")))
        runs.append(run_type(name=part.run_name("converted", seed), config=preset.ablation_config,
                             group="from-bert-converted", seed=seed, schedule=(part.stage,), init_from=base,
                             overrides=(*rope, *part.continue_overrides, f"seed={seed}")))
        runs.append(run_type(name=part.run_name("continued-bert", seed), config=preset.ablation_config,
                             group="from-bert-continued-bert", seed=seed, schedule=(part.stage,), init_from=base,
                             overrides=(*learned, *part.continue_overrides, f"seed={seed}")))
        runs.append(run_type(name=part.run_name("rope-scratch", seed), config=preset.ablation_config,
                             group="from-bert-rope-scratch", seed=seed, schedule=(*base_stages, part.stage),
                             overrides=(*rope, f"seed={seed}")))
    return runs


def exported_runs(preset) -> set[str]:
    """Runs whose export the part needs: each learned run (the BERT the continuations start from) and (a)-(c)."""
    part = preset.from_bert
    if part is None:
        return set()
    return {part.run_name(v, s) for v in (BASE, *VARIANTS) for s in part.seeds}


def eval_runs(preset, run_type) -> list:
    """Masked-LM evaluations of each model's last checkpoint; a learned one only within its table."""
    part = preset.from_bert
    runs = []
    for seed in part.seeds:
        for variant in (BASE, *VARIANTS):
            learned = variant in (BASE, "continued-bert")
            lens = tuple(n for n in part.eval_lens if not learned or n <= preset.absolute_positions)
            runs.append(run_type(part.run_name(variant, seed), variant, seed, None, lens, part.eval_tokens,
                                 part="from-bert"))
    return runs


def finetune_runs(preset, run_type) -> list:
    """inews at the part's budget: (a), (b), (c) of every pretraining seed, each fine-tuning seed."""
    part = preset.from_bert
    return [run_type(part.run_name(variant, pre), part.task, "pretrained", part.budget, part.max_length, seed,
                     "from-bert", part.finetune_args)
            for variant in VARIANTS for pre in part.seeds for seed in preset.finetune_seeds]


# ------------------------------------------------------------------------------------------------ results
def recovery_step(curve: list, target: float | None) -> int | None:
    """First validation step of `curve` ([step, loss, accuracy], ...) at or below `target`; None: never."""
    if target is None:
        return None
    return next((step for step, loss, *_ in curve if loss <= target), None)


def from_bert_table(preset, layout, pretrain: list, finetune: list, evals: list) -> dict:
    """results.json's "from-bert": per variant the loss per length, the recovery steps of (a), the fine-tunes."""
    from launcher.reproduce.results import comparison, finetune_table, spread

    part = preset.from_bert
    names = {part.run_name(v, s): v for v in (BASE, *VARIANTS) for s in part.seeds}
    groups = comparison([r for r in pretrain if r.name in names], layout)
    by_variant: dict = {}
    for group in groups.values():
        for name, summary in group["runs"].items():
            by_variant.setdefault(names[name], {})[name] = summary
    table: dict = {"stage": dict(part.stage), "base_steps": sum(s["steps"] for s in _stages(preset.ablation_schedule)),
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
    from launcher.reproduce.results import spread

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

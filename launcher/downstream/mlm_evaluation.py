"""`roformer eval-mlm EXPORT --data DATA_DIR | --input FILE... --seq-lens 128,512,1024`: masked-LM figures per length.

Every length sees the same first `--tokens` tokens of the held-out split, masked deterministically
(`--seed`), so the lengths differ only in context; lengths beyond pretraining are marked. Output: loss
(nats), accuracy and perplexity, as JSON. `--random-init` scores the export's random-init twin on the same
tokens. Own text (`--input`) is tokenized with the export's tokenizer into a temporary prepared directory
and evaluated as a prepared split. `--attention document` scores each packed document as if it stood alone:
a token attends only to its own document and positions restart at each one (data_pipeline/documents.py).
"""
from __future__ import annotations

import math
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from launcher.common.errors import UserError
from data_pipeline.config import CleaningConfig, InputConfig, PrepareConfig
from data_pipeline.errors import DataError
from data_pipeline.remote.url import is_remote
from launcher.common.size_checks import check_attention
from launcher.export.export_reader import load_masked_lm, trained_max_seq_len


@dataclass
class MLMEvalConfig:
    """What to evaluate and how much of it."""

    export_dir: Path  # transformers-format RoFormer directory with its tokenizer (spm.model or tokenizer.json)
    data_dir: Path | None  # prepared data dir (`roformer data prepare`), or its split directory; None with inputs
    seq_lens: list[int]  # sequence lengths (tokens incl. [CLS]); each >= 2
    split: str = "valid"  # split of the data dir; the held-out one by default
    tokens: int = 32768  # token budget per length: the same text at every length (0: all of it)
    inputs: tuple = ()  # own text files (txt / jsonl / parquet) instead of data_dir
    text_column: str | None = None  # JSONL field / parquet column of the text in `inputs` (None: "text")
    tokens_per_batch: int = 8192  # micro-batch = max(1, tokens_per_batch // seq_len) sequences
    seed: int = 0  # masking seed (the stream order of the split is fixed by it too)
    mask_prob: float = 0.15  # share of tokens predicted (80% [MASK], 10% random, 10% kept)
    threads: int = 0  # torch CPU threads (0 = leave torch's default)
    random_init: bool = False  # evaluate the export's random-init twin instead (same config and tokenizer)
    remote_options: object = None  # RemoteOptions for an s3:// data_dir (a run's cache settings); None: the defaults
    attention: str = "sequence"  # 'document': each packed document scored alone (its own attention and positions)

    def __post_init__(self) -> None:
        if not self.seq_lens:
            raise UserError("--seq-lens: at least one length is required")
        for n in self.seq_lens:
            if n < 2:
                raise UserError(f"--seq-lens: {n} is too short ([CLS] plus at least one token)")
        if bool(self.inputs) == (self.data_dir is not None):
            raise UserError("eval-mlm: give either --data DATA_DIR or --input FILE...")
        if self.tokens < 0 or self.tokens_per_batch < 1:
            raise UserError("--tokens / --tokens-per-batch: must be positive (--tokens 0: all the text)")
        if not 0.0 < self.mask_prob < 1.0:
            raise UserError(f"--mask-prob: {self.mask_prob} must be in (0, 1)")
        if self.attention not in ("sequence", "document"):
            raise UserError(f"--attention: {self.attention!r} is not one of sequence, document")


def evaluate_mlm(cfg: MLMEvalConfig) -> dict:
    import torch  # here, not at import: `roformer eval-mlm --help` must not wait for torch

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    model = load_masked_lm(cfg.export_dir, random_init=cfg.random_init)
    if cfg.inputs:
        with tempfile.TemporaryDirectory(prefix="roformer-eval-mlm-") as tmp:
            data_dir = _prepare_inputs(cfg, Path(tmp) / "data")
            report = _evaluate(cfg, model, data_dir, "train")
        report["config"].pop("split")  # of --data only
        return {**report, "data": [str(Path(p).resolve()) for p in cfg.inputs], "split": "input"}
    data_dir, split = _resolve_data(cfg.data_dir, cfg.split)
    return _evaluate(cfg, model, data_dir, split)


def _prepare_inputs(cfg: MLMEvalConfig, out: Path) -> Path:
    """The user's files as a prepared directory, tokenized with the export's tokenizer."""
    from data_pipeline.prepare import prepare

    reading = {"text_field": cfg.text_column} if cfg.text_column else {}
    prepare(PrepareConfig(input=InputConfig(inputs=[str(p) for p in cfg.inputs], **reading), out_dir=out,
                          existing_tokenizer=Path(cfg.export_dir),
                          cleaning=CleaningConfig(dedup=False, valid_fraction=0.0), workers=1),
            log=lambda message: None)
    return out


def _evaluate(cfg: MLMEvalConfig, model, data_dir: Path, split: str) -> dict:
    from data_pipeline import DocumentView, MaskingConfig, open_corpus, tokenizer_hash
    from data_pipeline.tokenizer import resolve_model_path

    try:
        tokenizer = resolve_model_path(Path(cfg.export_dir))
    except DataError as err:
        raise UserError(f"{err}; eval-mlm needs the export's tokenizer to check it matches the one the shards "
                        f"in {data_dir} were built with") from None
    corpus = open_corpus(data_dir, split=split, verify=True, expected_tokenizer_sha256=tokenizer_hash(tokenizer),
                         remote_options=cfg.remote_options)
    if corpus.vocab_size > model.config.vocab_size:
        raise UserError(f"{data_dir}: tokenizer has {corpus.vocab_size} ids, the model only {model.config.vocab_size}")
    masking = MaskingConfig(mask_prob=cfg.mask_prob)
    trained_len = trained_max_seq_len(cfg.export_dir)

    check_lengths(cfg, model.config, corpus)
    results = figures_per_length(model, corpus, cfg.seq_lens, tokens=cfg.tokens, tokens_per_batch=cfg.tokens_per_batch,
                                 seed=cfg.seed, masking=masking, trained_len=trained_len,
                                 documents=DocumentView(cfg.attention, cfg.attention))
    return {
        "export": str(Path(cfg.export_dir).resolve()),
        "data": corpus.location if corpus.remote is not None else str(Path(data_dir).resolve()),
        "split": split,
        "trained_max_seq_len": trained_len,
        "config": {k: v for k, v in asdict(cfg).items() if k not in ("export_dir", "data_dir", "inputs", "remote_options")},
        "results": results,
    }


def check_lengths(cfg: MLMEvalConfig, config, corpus) -> None:
    """Each length against the text (a sequence longer than all of it would repeat it) and against memory."""
    from data_pipeline import PretrainBatches

    available = PretrainBatches(corpus, rank=0, world_size=1, seed=cfg.seed).stream.epoch_length
    for seq_len in cfg.seq_lens:
        check_attention("--seq-lens", seq_len, max(1, cfg.tokens_per_batch // seq_len), config.hidden_size,
                        config.num_attention_heads, config.intermediate_size)
        if seq_len - 1 > available:
            where = "the --input text" if cfg.inputs else f"split {corpus.split!r} of {corpus.data_dir}"
            raise UserError(f"--seq-lens {seq_len}: {where} holds {available:,} tokens, fewer than one sequence of "
                            f"{seq_len:,} ([CLS] + {seq_len - 1:,}); give lengths up to {available + 1:,} or more text")


def figures_per_length(model, corpus, seq_lens: list[int], *, tokens: int, tokens_per_batch: int, seed: int, masking,
                       trained_len: int | None, documents=None) -> list[dict]:
    """Masked-LM figures of `model` at each length on the same first `tokens` tokens of `corpus` (0: all of it),
    masked the same way (seeded); each marked when longer than `trained_len`. documents: the batches'
    data_pipeline.DocumentView (None: whole sequences, as in pretraining by default)."""
    from data_pipeline import PretrainBatches

    results = []
    for seq_len in seq_lens:
        batches = PretrainBatches(corpus, rank=0, world_size=1, seed=seed, masking=masking)
        if documents is not None:
            batches.set_document_view(documents)
        # Each sequence covers seq_len - 1 stream tokens after its [CLS]: this many sequences cover
        # the first `tokens` tokens of the split (or all of it) at every length.
        sequences = max(1, math.ceil((tokens or batches.stream.epoch_length) / (seq_len - 1)))
        micro = max(1, min(tokens_per_batch // seq_len, sequences))
        started = time.perf_counter()
        figures = _masked_lm_figures(model, _first_sequences(batches, seq_len, micro, sequences))
        figures.update(seq_len=seq_len, micro_batch_size=micro,
                       longer_than_trained=None if trained_len is None else seq_len > trained_len,
                       seconds=round(time.perf_counter() - started, 2))
        results.append(figures)
    return results


def _first_sequences(batches, seq_len: int, micro: int, sequences: int):
    """The deterministic eval pass cut to exactly `sequences` rows (the last batch trimmed)."""
    left = sequences
    for batch in batches.iter_eval_batches(seq_len, micro, max_batches=math.ceil(sequences / micro)):
        yield {k: v[:left] for k, v in batch.items()}
        left -= micro


def _masked_lm_figures(model, batches) -> dict:
    """Sums over all masked positions, so the means weigh every prediction equally."""
    import torch

    loss_sum, masked, correct, sequences, real_tokens = 0.0, 0, 0, 0, 0
    with torch.no_grad():
        for batch in batches:
            out = model(**batch)  # with the batch's masked positions (and document ids, positions)
            loss_sum += float(out.loss_sum)
            masked += int(out.num_masked)
            correct += int(out.num_correct)
            sequences += int((batch["attention_mask"].sum(dim=1) > 0).sum())
            real_tokens += int(batch["attention_mask"].sum())
    if masked == 0:
        raise UserError("eval-mlm: no masked tokens in the evaluated text (split too small?)")
    loss = loss_sum / masked
    return {"sequences": sequences, "tokens": real_tokens, "masked_tokens": masked, "loss": round(loss, 5),
            "accuracy": round(correct / masked, 5), "perplexity": round(math.exp(min(loss, 700.0)), 3)}


def _resolve_data(path: Path, split: str) -> tuple[Path, str]:
    """A data dir, or a split dir inside one (DATA/valid) which then names the split."""
    if is_remote(path):  # a run's s3:// data (stage-end evals): read through the node-local cache
        return path, split
    path = Path(path)
    if not path.exists():
        raise UserError(f"--data {path}: not found")
    if not (path / "manifest.json").is_file() and (path.parent / "manifest.json").is_file():
        return path.parent, path.name
    return path, split

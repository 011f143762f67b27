"""`roformer data prepare|tokenizer`: thin wrapper over data_pipeline (options -> config -> call)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    prep = sub.add_parser("prepare", help="raw text -> tokenizer + train/valid shards + manifest")
    _input_args(prep)
    prep.add_argument("--out", type=Path, required=True, help="prepared data directory")
    prep.add_argument("--workers", type=int, default=1, help="parallel worker processes")
    prep.add_argument("--valid-fraction", type=float, default=0.01, help="share of documents for validation")
    prep.add_argument("--max-documents", type=int, default=None, help="read at most N documents (demo subsets)")
    prep.add_argument("--nfkc", action="store_true", help="apply Unicode NFKC normalization")
    prep.add_argument("--keep-control-chars", action="store_true", help="do not strip control characters")
    prep.add_argument("--no-dedup", action="store_true", help="keep exact duplicate documents")
    prep.add_argument("--shard-tokens", type=int, default=1 << 25, help="tokens per shard before rolling over")
    prep.add_argument("--tokenizer", type=Path, default=None,
                      help="reuse this spm.model / tokenizer dir / data dir instead of training one")
    prep.add_argument("--overwrite", action="store_true", help="replace an existing prepared directory")
    _tokenizer_args(prep)

    tok = sub.add_parser("tokenizer", help="train only the SentencePiece tokenizer (+ transformers files)")
    _input_args(tok)
    tok.add_argument("--out", type=Path, required=True, help="tokenizer directory to write")
    tok.add_argument("--max-documents", type=int, default=None, help="read at most N documents")
    _tokenizer_args(tok)


def _input_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", nargs="+", default=[], help="files, directories or globs")
    p.add_argument("--default-corpus", nargs="?", const="en,zh", default=None, metavar="LANGS",
                   help="add the bundled corpus installed by scripts/setup.sh (en, zh or en,zh; default both)")
    p.add_argument("--data-cache", type=Path, default=None,
                   help="set-up data cache for --default-corpus "
                        "(default: $ROFORMER_DATA_DIR or ~/.cache/roformer-ds/data)")
    p.add_argument("--format", default="auto", choices=["auto", "txt", "jsonl", "parquet"])
    p.add_argument("--txt-mode", default="line", choices=["line", "paragraph"],
                   help=".txt documents: one per line or blank-line-separated blocks")
    p.add_argument("--text-field", default="text", help="JSONL/parquet field holding the text")
    p.add_argument("--lenient", action="store_true", help="skip and count bad lines/files instead of failing")


def _tokenizer_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--model-type", default="bpe", choices=["bpe", "unigram"])
    p.add_argument("--tokenizer-sample-mb", type=float, default=50.0, help="text sampled to train the tokenizer")
    p.add_argument("--character-coverage", type=float, default=0.9995)


def run(args: argparse.Namespace) -> int:
    from data_pipeline.config import CleaningConfig, InputConfig, PrepareConfig, TokenizerConfig
    from data_pipeline.prepare import prepare, train_tokenizer_only

    input_cfg = InputConfig(inputs=_inputs(args), text_format=args.format, txt_mode=args.txt_mode,
                            text_field=args.text_field, lenient=args.lenient)
    tok_cfg = TokenizerConfig(vocab_size=args.vocab_size, model_type=args.model_type,
                              sample_bytes=int(args.tokenizer_sample_mb * 1e6),
                              character_coverage=args.character_coverage)
    if args.data_command == "tokenizer":
        path = train_tokenizer_only(input_cfg, tok_cfg, args.out, max_documents=args.max_documents)
        print(f"tokenizer written to {path.parent}")
        return 0
    cfg = PrepareConfig(
        input=input_cfg, out_dir=args.out, tokenizer=tok_cfg, existing_tokenizer=args.tokenizer,
        cleaning=CleaningConfig(nfkc=args.nfkc, strip_control=not args.keep_control_chars,
                                dedup=not args.no_dedup, valid_fraction=args.valid_fraction,
                                max_documents=args.max_documents),
        workers=args.workers, shard_tokens=args.shard_tokens, overwrite=args.overwrite)
    report = prepare(cfg)
    print(report.summary(), file=sys.stderr)
    return 0


def _inputs(args: argparse.Namespace) -> list[str]:
    inputs = list(args.input)
    if args.default_corpus:
        from data_pipeline.sources import default_corpus_files, default_data_cache

        languages = tuple(x.strip() for x in args.default_corpus.split(",") if x.strip())
        inputs += [str(p) for p in default_corpus_files(args.data_cache or default_data_cache(), languages)]
    return inputs  # empty -> InputConfig names the missing field

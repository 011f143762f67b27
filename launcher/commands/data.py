"""`roformer data prepare|tokenizer|upload`: thin wrapper over data_pipeline (options -> config -> call).
`prepare --out s3://BUCKET/PREFIX` prepares into a local temporary directory and uploads it
(data_pipeline/remote/upload.py), the manifest last."""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from launcher.cli import raise_if_stopped
from launcher.common.errors import UserError
from launcher.flag_types import non_negative_int, positive_float
from launcher.outputs.gate import PREPARED, TOKENIZER, add_output
from launcher.outputs.output_paths import DATA, check_paths, publishing


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    shown = {"formatter_class": parser.formatter_class}  # the defaults shown, as for every subcommand
    prep = sub.add_parser("prepare", help="raw text -> tokenizer + train/valid shards + manifest",
                          description="raw text -> tokenizer + train/valid shards + manifest", **shown)
    _input_args(prep)
    add_output(prep, "--out", PREPARED, required=True,
               help="prepared data directory, or s3://BUCKET/PREFIX (prepared in a temporary directory, "
                           "then uploaded, the manifest last)")
    prep.add_argument("--workers", type=int, default=1, help="parallel worker processes")
    prep.add_argument("--valid-fraction", type=float, default=0.01, help="share of documents for validation")
    prep.add_argument("--max-documents", type=int, default=None,
                      help="read at most N documents of each source, e.g. for demo subsets (default: all)")
    prep.add_argument("--nfkc", action="store_true", help="apply Unicode NFKC normalization")
    prep.add_argument("--keep-control-chars", action="store_true", help="do not strip control characters")
    prep.add_argument("--no-dedup", action="store_true", help="keep exact duplicate documents")
    prep.add_argument("--shard-tokens", type=int, default=1 << 25, help="tokens per shard before rolling over")
    prep.add_argument("--tokenizer", type=Path, default=None,
                      help="reuse this spm.model / data dir / transformers tokenizer dir (tokenizer.json, or "
                           "vocab.txt: BertTokenizer, RoFormerTokenizer with jieba), its special ids as they are "
                           "(default: train a tokenizer)")
    prep.add_argument("--overwrite", action="store_true", help="replace an existing prepared directory")
    _tokenizer_args(prep)

    tok = sub.add_parser("tokenizer", help="train only the SentencePiece tokenizer (+ transformers files)",
                         description="train only the SentencePiece tokenizer (+ transformers files)", **shown)
    _input_args(tok)
    add_output(tok, "--out", TOKENIZER, required=True,
               help="tokenizer directory to write: a new or empty one, or one `data tokenizer` wrote, unchanged")
    tok.add_argument("--max-documents", type=int, default=None, help="read at most N documents (default: all)")
    _tokenizer_args(tok)

    up = sub.add_parser("upload", help="copy a prepared directory to s3://BUCKET/PREFIX (resumable, manifest last)",
                        description="copy a prepared directory to s3://BUCKET/PREFIX: objects whose size and sha256 "
                                    "already match are skipped, the manifest goes up last; endpoint and credentials "
                                    "from the standard AWS chain (AWS_ENDPOINT_URL, AWS_PROFILE, ...)", **shown)
    up.add_argument("data_dir", type=Path, help="prepared data directory (`roformer data prepare --out DIR`)")
    up.add_argument("destination", help="s3://BUCKET/PREFIX")
    up.add_argument("--overwrite", action="store_true",
                    help="replace other prepared data at DESTINATION (a different manifest.json)")
    _remote_args(up)
    _remote_args(prep)


def _remote_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--remote-retries", type=non_negative_int, default=5,
                   help="s3:// only: retries of a request that timed out or got a 5xx answer")
    p.add_argument("--remote-timeout", type=positive_float, default=30.0,
                   help="s3:// only: seconds to connect and between bytes of an answer")


def _input_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", nargs="+", default=[],
                   help="files, directories or globs: the source named 'default' (default: none; give --input, "
                        "--source, --default-corpus or several)")
    p.add_argument("--source", action="append", default=[], metavar="NAME=PATH[,PATH...]",
                   help="a named source (repeatable): files, directories or globs as --input takes them; each "
                        "source gets its own shards and validation split, and stages' `mixture` weighs them "
                        "(default: none; --input files are the source 'default')")
    p.add_argument("--default-corpus", nargs="?", const="en,zh", default=None, metavar="NAMES",
                   help="add bundled corpora installed by scripts/setup.sh, comma-separated, each a source of that "
                        "name: en (linux-doc), zh (People's Daily), wordnet (WordNet glosses), task-train (the "
                        "downstream tasks' TRAINING text, never dev/test) (default when given without a value: en,zh)")
    p.add_argument("--data-cache", type=Path, default=None,
                   help="set-up data cache for --default-corpus "
                        "(default: $ROFORMER_DATA_DIR or ~/.cache/roformer-ds/data)")
    p.add_argument("--format", default="auto", choices=["auto", "txt", "jsonl", "parquet"],
                   help="how to read the input files (auto: by extension)")
    # Defaults None (= InputConfig's), so an option given for input it does not apply to is refused.
    p.add_argument("--txt-mode", default=None, choices=["line", "paragraph"],
                   help=".txt documents: one per line (default) or blank-line-separated blocks")
    p.add_argument("--text-field", default=None, help="JSONL/parquet field holding the text (default: text)")
    p.add_argument("--lenient", action="store_true", help="skip and count bad lines/files instead of failing")


# Options of training a tokenizer: flag -> (TokenizerConfig field, flag value -> field value). They
# default to None (= TokenizerConfig's default), so one given with --tokenizer (nothing is trained) is refused.
TRAINING_OPTIONS = {"--vocab-size": ("vocab_size", int), "--model-type": ("model_type", str),
                    "--tokenizer-sample-mb": ("sample_bytes", lambda mb: int(mb * 1e6)),
                    "--character-coverage": ("character_coverage", float)}


def _tokenizer_args(p: argparse.ArgumentParser) -> None:
    from data_pipeline.config import TokenizerConfig as T

    p.add_argument("--vocab-size", type=int, default=None,
                   help=f"pieces including the 5 special tokens (default: {T.vocab_size})")
    p.add_argument("--model-type", default=None, choices=["bpe", "unigram"],
                   help=f"SentencePiece model type (default: {T.model_type})")
    p.add_argument("--tokenizer-sample-mb", type=float, default=None,
                   help=f"MB of text sampled to train the tokenizer (default: {T.sample_bytes / 1e6:g})")
    p.add_argument("--character-coverage", type=float, default=None,
                   help=f"share of characters the tokenizer must cover, rarer ones map to [UNK] "
                        f"(default: {T.character_coverage})")


def run(args: argparse.Namespace) -> int:
    from data_pipeline.config import InputConfig, TokenizerConfig
    from data_pipeline.prepare import prepare, train_tokenizer_only
    from data_pipeline.remote.url import is_remote

    if args.data_command == "upload":
        return _upload(args)
    remote_out = args.data_command == "prepare" and is_remote(args.out)
    if args.data_command == "prepare" and not remote_out:
        args.out = Path(args.out)

    reading = {"txt_mode": args.txt_mode, "text_field": args.text_field}
    input_cfg = InputConfig(inputs=list(args.input), sources=_sources(args), text_format=args.format,
                            lenient=args.lenient, **{key: value for key, value in reading.items() if value is not None})
    _check_reading_options(args, input_cfg)
    if remote_out:
        _check_remote_out(args)
    else:
        check_data_paths(args, input_cfg)
    given = {flag: getattr(args, flag[2:].replace("-", "_")) for flag in TRAINING_OPTIONS}
    given = {flag: value for flag, value in given.items() if value is not None}
    if given and getattr(args, "tokenizer", None) is not None:
        _refuse_training_options(args.tokenizer, list(given))
    tok_cfg = _named_by_flag(args, lambda: TokenizerConfig(**{TRAINING_OPTIONS[flag][0]: TRAINING_OPTIONS[flag][1](value)
                                                             for flag, value in given.items()}))
    if args.data_command == "tokenizer":
        path = train_tokenizer_only(input_cfg, tok_cfg, args.out, max_documents=args.max_documents,
                                    before_publish=raise_if_stopped)
        from launcher.outputs.written import record_written

        record_written(args.out, TOKENIZER.name, TOKENIZER.made_by)  # ours: a later `data tokenizer` may replace it
        print(f"tokenizer written to {path.parent}")
        return 0
    if remote_out:
        return _prepare_to_bucket(args, input_cfg, tok_cfg)
    cfg = _named_by_flag(args, lambda: _prepare_config(args, input_cfg, tok_cfg, args.out))
    if args.valid_fraction == 0:
        print("roformer data: warning: --valid-fraction 0: no validation split; `roformer pretrain` refuses such "
              "data (it validates), eval-mlm --data needs --split train", file=sys.stderr)
    with publishing("--out", args.out, DATA, "roformer data prepare") as out:
        _refuse_leased(args, out)  # a live run reads it: refused before any work, and again before publishing
        report = prepare(dataclasses.replace(cfg, out_dir=out),
                         before_publish=lambda: (raise_if_stopped(), _refuse_leased(args, out)))
    print(report.summary(), file=sys.stderr)
    return 0


def _named_by_flag(args: argparse.Namespace, build):
    """build() of a data config from the flags; its DataError names the config field (`workers: -2 must be
    >= 1`), which the user gave as a flag: the line names the flag (`--workers: -2 must be >= 1`)."""
    from data_pipeline.errors import DataError

    try:
        return build()
    except DataError as err:
        field, sep, rest = str(err).partition(": ")
        flag = f"--{field.replace('_', '-')}"
        if sep and field.isidentifier() and (hasattr(args, field) or flag in TRAINING_OPTIONS):
            raise DataError(f"{flag}: {rest}") from None
        raise


def _prepare_config(args: argparse.Namespace, input_cfg, tok_cfg, out_dir: Path):
    from data_pipeline.config import CleaningConfig, PrepareConfig

    return PrepareConfig(
        input=input_cfg, out_dir=out_dir, tokenizer=tok_cfg, existing_tokenizer=args.tokenizer,
        cleaning=CleaningConfig(nfkc=args.nfkc, strip_control=not args.keep_control_chars,
                                dedup=not args.no_dedup, valid_fraction=args.valid_fraction,
                                max_documents=args.max_documents),
        workers=args.workers, shard_tokens=args.shard_tokens, overwrite=args.overwrite)


def _check_remote_out(args: argparse.Namespace) -> None:
    """--out s3://...: the location parses, the bucket answers, and prepared data there needs --overwrite."""
    from data_pipeline.remote.upload import remote_manifest_exists
    from data_pipeline.remote.url import parse_location

    parse_location(args.out, "--out")
    if remote_manifest_exists(args.out, args.remote_retries, args.remote_timeout) and not args.overwrite:
        raise UserError(f"--out {args.out}: already holds prepared data (a manifest.json); use --overwrite to "
                        f"replace it")
    _refuse_leased(args, args.out)


def _prepare_to_bucket(args: argparse.Namespace, input_cfg, tok_cfg) -> int:
    """Prepare into a temporary directory, upload it (manifest last), remove it."""
    import shutil
    import tempfile

    from data_pipeline.prepare import prepare
    from data_pipeline.remote.upload import upload_directory

    work = Path(tempfile.mkdtemp(prefix="roformer-prepare-"))
    try:
        report = prepare(_prepare_config(args, input_cfg, tok_cfg, work / "data"), before_publish=raise_if_stopped)
        print(report.summary(), file=sys.stderr)
        raise_if_stopped()  # the upload publishes
        _refuse_leased(args, args.out)  # a run may have started on it while this one prepared
        uploaded = upload_directory(work / "data", args.out, args.remote_retries, args.remote_timeout,
                                    overwrite=args.overwrite)  # checked before preparing
        print(uploaded.summary(), file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _upload(args: argparse.Namespace) -> int:
    from data_pipeline.remote.upload import upload_directory
    from data_pipeline.remote.url import is_remote

    if not is_remote(args.destination):
        raise UserError(f"DESTINATION {args.destination}: expected s3://BUCKET/PREFIX")
    if not args.data_dir.is_dir():
        raise UserError(f"DATA_DIR {args.data_dir}: not a directory (a `roformer data prepare --out` directory)")
    if not DATA.recognise(args.data_dir):  # by our manifest's own fields: not any folder with a manifest.json
        why = ("its manifest.json is not one `roformer data prepare` wrote"
               if (args.data_dir / "manifest.json").exists() else "no manifest.json")
        raise UserError(f"DATA_DIR {args.data_dir}: not prepared data ({why}); prepare it with `roformer data prepare`")
    _refuse_leased(args, args.destination, "DESTINATION")
    report = upload_directory(args.data_dir, args.destination, args.remote_retries, args.remote_timeout,
                              log=lambda line: print(line, file=sys.stderr), overwrite=args.overwrite)
    print(report.summary(), file=sys.stderr)
    return 0


def _refuse_leased(args: argparse.Namespace, location, flag: str = "--out") -> None:
    """Data a live run reads (its lease, launcher/run_dir/data_lease.py) is not replaced: one line naming the run."""
    from launcher.common.io import write_line
    from launcher.run_dir.data_lease import refuse_leased

    refuse_leased(location, flag, lambda text: write_line(f"roformer data: note: {text}"),
                  getattr(args, "remote_retries", 5), getattr(args, "remote_timeout", 30.0))


def check_data_paths(args: argparse.Namespace, input_cfg) -> None:
    """--out against every input (launcher/outputs/output_paths.py): never one of them, inside or around one
    (its own rule by its kind: launcher/outputs/gate.py, run by launcher/cli.py)."""
    import glob

    from data_pipeline.inputs import resolve_inputs

    specs = input_cfg.all_inputs()
    inputs = {"--input": [s for s in specs if not glob.has_magic(s) or Path(s).exists()]
              + [f for s in specs if glob.has_magic(s) and not Path(s).exists() for f in resolve_inputs([s])],
              "--tokenizer": getattr(args, "tokenizer", None)}
    check_paths(inputs, {"--out": args.out})


def _sources(args: argparse.Namespace) -> list:
    """Named sources: each --source NAME=PATH[,PATH...], then each --default-corpus name (plain --input
    files are the source 'default', added by InputConfig); empty -> InputConfig names the missing field."""
    from data_pipeline.config import SourceSpec, check_source_name

    sources = []
    for value in args.source:
        name, sep, paths = value.partition("=")
        if not sep:
            raise UserError(f"--source {value}: expected NAME=PATH[,PATH...]")
        check_source_name(name.strip(), f"--source {value}")
        sources.append(SourceSpec(name.strip(), [p for p in (x.strip() for x in paths.split(",")) if p]))
    if args.default_corpus:
        from data_pipeline.sources import default_corpus_files, default_data_cache

        cache = args.data_cache or default_data_cache()
        for name in (x.strip() for x in args.default_corpus.split(",") if x.strip()):
            sources.append(SourceSpec(name, [str(p) for p in default_corpus_files(cache, (name,))]))
    return sources


def _refuse_training_options(tokenizer: Path, flags: list[str]) -> None:
    """--tokenizer reuses a trained tokenizer as it is: options of training one would be ignored."""
    from data_pipeline.tokenizer import load_tokenizer

    pieces = f" ({load_tokenizer(tokenizer).get_piece_size()} pieces)"
    raise UserError(f"{', '.join(flags)}: options of training a tokenizer, but --tokenizer {tokenizer}{pieces} "
                    f"is reused as it is; drop {'them' if len(flags) > 1 else 'it'} or --tokenizer")


def _check_reading_options(args: argparse.Namespace, input_cfg) -> None:
    """--text-field applies to JSONL/parquet input, --txt-mode to text files: given for input that has
    none of them, it would be silently ignored (e.g. `--format txt --text-field body` on JSONL reads
    every line, JSON and all, as a document)."""
    from data_pipeline.inputs import file_format, resolve_inputs

    if args.text_field is None and args.txt_mode is None:
        return
    formats = {file_format(path, input_cfg.text_format): path for path in resolve_inputs(input_cfg.all_inputs())}
    how = f"--format {args.format}" if args.format != "auto" else "by extension"
    for flag, value, applies_to in (("--text-field", args.text_field, ("jsonl", "parquet")),
                                    ("--txt-mode", args.txt_mode, ("txt",))):
        if value is not None and not set(formats) & set(applies_to):
            example = next(iter(formats.values()))
            raise UserError(f"{flag} {value}: applies to {'/'.join(applies_to)} input only, but every input is read "
                            f"as {'/'.join(formats)} ({how}, e.g. {example}); drop {flag}"
                            f"{f' or {how}' if args.format != 'auto' else ''}")

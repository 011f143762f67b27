"""`roformer eval-mlm EXPORT --data DATA_DIR | --input FILE... --seq-lens 128,512,1024`: the command line of
launcher.downstream.mlm_evaluation."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from launcher.downstream.mlm_evaluation import MLMEvalConfig, evaluate_mlm
from launcher.common.errors import UserError
from launcher.flag_types import non_negative_int, seed_int
from launcher.common.io import atomic_write_json
from launcher.outputs.gate import EVAL_REPORT, add_output
from launcher.outputs.output_paths import check_paths, writer_locks
from launcher.outputs.written import record_written

DATA_TOKENS = 32768
"""--tokens default: enough for steady figures at a few seconds per length on CPU."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("export_dir", type=Path, help="export directory (roformer export --out)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", type=Path, default=None, help="prepared data dir (or its valid/ directory)")
    source.add_argument("--input", nargs="+", default=[], metavar="FILE",
                        help="your own text instead: .txt (one document per line), .jsonl/.json or .parquet files, "
                             "directories or globs, read as `roformer data prepare` reads them and tokenized with the "
                             "export's tokenizer")
    parser.add_argument("--text-column", default=None,
                        help="JSONL field / parquet column holding the text of --input files (default: text)")
    parser.add_argument("--seq-lens", default="128,512,1024",
                        help="comma-separated sequence lengths in tokens, [CLS] included; any length works "
                             "(RoPE has no limit), lengths past the trained one are marked")
    parser.add_argument("--split", default="valid", help="split of the data dir to evaluate on")
    parser.add_argument("--tokens", type=int, default=DATA_TOKENS,
                        help="token budget per length: the same first N tokens of the split or --input text at "
                             "every length; 0 = all of it")
    parser.add_argument("--tokens-per-batch", type=int, default=8192,
                        help="tokens per forward pass (micro-batch = this // length sequences); bounds memory")
    parser.add_argument("--seed", type=seed_int, default=0, help="masking seed (which tokens are masked, and how)")
    parser.add_argument("--mask-prob", type=float, default=0.15,
                        help="share of tokens predicted (80%% [MASK], 10%% random, 10%% kept)")
    parser.add_argument("--threads", type=non_negative_int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--random-init", action="store_true",
                        help="evaluate the export's random-init twin (same architecture and tokenizer, fresh weights "
                             "from seed 0) on the same tokens: the baseline that shows what pretraining learned")
    parser.add_argument("--attention", choices=("sequence", "document"), default="sequence",
                        help="document: score each packed document as if it stood alone (a token attends only to "
                             "its own document, positions restart at each); sequence (default): the whole sequence")
    add_output(parser, "--out", EVAL_REPORT, default=None,
               help="also write the JSON report to this file: a new one, or one eval-mlm wrote before, unchanged "
                    "(default: printed only)")


def run(args: argparse.Namespace) -> int:
    try:
        seq_lens = [int(x) for x in args.seq_lens.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--seq-lens: {args.seq_lens!r} is not a comma-separated list of integers") from None
    repeated = sorted({n for n in seq_lens if seq_lens.count(n) > 1})
    if repeated:  # each length would be evaluated (and reported) twice, on the same tokens and masks
        raise UserError(f"--seq-lens: {args.seq_lens!r} gives {', '.join(map(str, repeated))} more than once")
    check_paths({"EXPORT": args.export_dir, "--data": args.data, "--input": list(args.input)}, {"--out": args.out})
    if args.text_column is not None and not args.input:
        raise UserError("--text-column: applies to --input files only (a --data dir is tokenized already)")
    cfg = MLMEvalConfig(export_dir=args.export_dir, data_dir=args.data, seq_lens=seq_lens, split=args.split,
                        tokens=args.tokens, inputs=tuple(args.input), text_column=args.text_column,
                        tokens_per_batch=args.tokens_per_batch, seed=args.seed,
                        mask_prob=args.mask_prob, threads=args.threads, random_init=args.random_init,
                        attention=args.attention)
    with writer_locks({"--out": args.out}, "roformer eval-mlm"):  # one writer per output (launcher/outputs/output_paths.py)
        report = evaluate_mlm(cfg)
        if args.out is not None:
            atomic_write_json(args.out, report)
            record_written(args.out, EVAL_REPORT.name, EVAL_REPORT.made_by)
    print(json.dumps(report, indent=2))
    return 0

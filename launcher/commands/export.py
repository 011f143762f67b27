"""`roformer export RUN_DIR [--tag TAG | --average-last N | --average TAG,...] --out DIR`: the command line of
launcher.export.exporter (averaging: launcher.checkpoint.weights)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from data_pipeline.remote.url import is_remote
from launcher.checkpoint.weights import AverageRequest
from launcher.export.export_reader import EXPORT_INFO
from launcher.export.exporter import (MAX_POSITIONS_PER_TRAINED_LENGTH, MIN_MAX_POSITIONS, export_checkpoint,
                                      run_data_section)
from launcher.outputs.gate import EXPORTED, add_output
from launcher.outputs.output_paths import EXPORT, check_paths, publishing


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, help="run directory (holds checkpoints/)")
    parser.add_argument("--tag", default=None, help="checkpoint tag (default: the one checkpoints/latest names)")
    parser.add_argument("--average-last", type=int, default=None, metavar="N",
                        help="export the element-wise mean of the fp32 weights of the N newest complete checkpoints "
                             "(default: no averaging)")
    parser.add_argument("--average", default=None, metavar="TAG,TAG,...",
                        help="export the element-wise mean of the fp32 weights of these checkpoints (default: no "
                             "averaging)")
    add_output(parser, "--out", EXPORTED, required=True,
               help="export directory to create, or an earlier export to replace (only while it holds nothing but "
                    "what the export wrote, unchanged)")
    parser.add_argument("--tokenizer-from", type=Path, default=None,
                        help="prepared data dir (or tokenizer dir) to take the tokenizer from "
                             "(default: data.data_dir of RUN_DIR/config.yaml)")
    parser.add_argument("--max-positions", type=int, default=None, metavar="N",
                        help="longest input transformers' RoFormer will accept: the size of the RoPE table it "
                             "reads positions from (our eval-mlm / finetune have no limit). Default: the larger "
                             f"of {MIN_MAX_POSITIONS} and {MAX_POSITIONS_PER_TRAINED_LENGTH}x the longest length "
                             "the checkpoint was trained at")
    parser.add_argument("--no-verify", action="store_true",
                        help="skip reloading the export with transformers and comparing logits")


def run(args: argparse.Namespace) -> int:
    data_dir = run_data_section(args.run_dir).get("data_dir") if args.tokenizer_from is None else None
    check_paths({"RUN_DIR": args.run_dir, "--tokenizer-from": args.tokenizer_from,
                 "data.data_dir": None if is_remote(data_dir) else data_dir}, {"--out": args.out},
                may_hold=("RUN_DIR",))  # RUN_DIR/export is the usual place
    average = AverageRequest.from_flags(args.average_last, args.average, args.tag)
    with publishing("--out", args.out, EXPORT, "roformer export") as where:
        out = export_checkpoint(args.run_dir, where, tag=args.tag, tokenizer_from=args.tokenizer_from,
                                verify=not args.no_verify, max_positions=args.max_positions, average=average)
    info = json.loads((out / EXPORT_INFO).read_text(encoding="utf-8"))
    where = f"step {info['step']}, stage {info['stage_index'] + 1} '{info['stage']}'"
    what = f"{info['tag']} ({where})"
    if "averaged" in info:
        what = f"the mean of {', '.join(a['tag'] for a in info['averaged'])} (newest at {where})"
    print(f"exported {what} -> {args.out}; transformers' RoFormer accepts inputs of up to {info['max_positions']:,} "
          f"tokens (--max-positions)")
    from launcher.tracking.attach import sync_run

    sync_run(args.run_dir, [(out / "README.md", f"exports/{out.name}"), (out / EXPORT_INFO, f"exports/{out.name}")])
    return 0

"""`roformer finetune EXPORT --task NAME`: the command line of launcher.downstream.fine_tuning."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from launcher.downstream.fine_tuning import _HELP, INITS, FinetuneConfig, finetune, side_by_side
from launcher.errors import UserError
from launcher.io import atomic_write_json


def configure(parser: argparse.ArgumentParser) -> None:
    from launcher.downstream.tasks import TASKS

    parser.add_argument("export_dir", type=Path, help="export directory (roformer export --out) or any "
                                                      "transformers RoFormer directory with a tokenizer")
    parser.add_argument("--task", required=True, help=f"one of: {', '.join(TASKS)}")
    parser.add_argument("--task-data", type=Path, default=None,
                        help="task files root (default: $ROFORMER_DATA_DIR/tasks or ~/.cache/roformer-ds/data/tasks)")
    parser.add_argument("--init", choices=INITS, default="pretrained",
                        help="encoder weights: the export's (pretrained) or its random-init twin: same architecture "
                             "and tokenizer, freshly initialised (default: pretrained)")
    parser.add_argument("--compare-random-init", action="store_true",
                        help="also fine-tune the random-init twin with the same settings and print both side by "
                             "side (the JSON report gets a 'random_init' entry)")
    defaults = FinetuneConfig.__dataclass_fields__
    for name, help_text in _HELP.items():
        default = defaults[name].default
        kind = float if isinstance(default, float) else int
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=default,
                            help=f"{help_text} (default: {default})")
    parser.add_argument("--dropout", type=float, default=None,
                        help="hidden and attention dropout while fine-tuning (default: the export's config)")
    parser.add_argument("--out", type=Path, default=None,
                        help="also write the JSON report to this file (default: printed only)")


def run(args: argparse.Namespace) -> int:
    fields = FinetuneConfig.__dataclass_fields__
    cfg = FinetuneConfig(**{k: getattr(args, k) for k in fields})
    if args.compare_random_init and cfg.init != "pretrained":
        raise UserError("--compare-random-init compares the pretrained export with its twin: drop --init random")
    report = finetune(cfg)
    if args.compare_random_init:
        report["random_init"] = finetune(dataclasses.replace(cfg, init="random"))
        print(side_by_side(report), file=sys.stderr)
    if args.out is not None:
        atomic_write_json(args.out, report)
    print(json.dumps(report, indent=2))
    return 0

"""The `roformer` command line.

Each subcommand lives in its own module, which exposes `configure(parser)` (adds its arguments)
and `run(args) -> int`. Modules are imported only when their subcommand runs, so `roformer --help`
stays fast and a broken optional dependency only breaks the command that needs it.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from launcher.defaults import BAD_INPUT_EXIT_CODE
from launcher.errors import user_errors

# name -> (module, one-line help). The names are part of the public interface: docs and scripts
# rely on them.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "data": ("launcher.data_command", "prepare corpora and train the SentencePiece tokenizer"),
    "plan": ("launcher.config.plan_command", "validate a run config and print the resolved stages and batch arithmetic"),
    "pretrain": ("launcher.launch.pretrain_command", "staged MLM pretraining under DeepSpeed (single node or a hostfile)"),
    "export": ("launcher.downstream.export", "export a checkpoint as a transformers RoFormer directory"),
    "eval-mlm": ("launcher.downstream.eval_mlm", "masked-LM loss / accuracy / perplexity of an export at several lengths"),
    "finetune": ("launcher.downstream.finetune", "fine-tune and evaluate an export on a labelled classification task"),
    "report": ("launcher.report.command", "one-page report.md and PNG plots of a run (running or stopped)"),
    "reproduce": ("launcher.reproduce.command", "reproduce the paper's claims at small scale: runs, plots, report"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="roformer", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = next((a for a in sys.argv[1:] if a in SUBCOMMANDS), None)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        # Only the chosen subcommand's module is imported; the others just need their name listed.
        if name == chosen:
            importlib.import_module(module_name).configure(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    args = build_parser().parse_args(argv)
    module = importlib.import_module(SUBCOMMANDS[args.command][0])
    try:
        return int(module.run(args) or 0)
    except user_errors() as err:  # bad input: one clear line naming what is wrong, no traceback
        print(f"roformer {args.command}: error: {err}", file=sys.stderr)
        return BAD_INPUT_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())

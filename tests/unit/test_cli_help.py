"""Every `roformer` subcommand's help: each option described with its default, answered at once.

The parsers are built the way `roformer` builds them (launcher.cli.build_parser, one subcommand at a
time). "At once" is checked by its cause: `python -m launcher WORDS --help`, run whole in a fresh
interpreter, imports none of torch, DeepSpeed, transformers or matplotlib (any one of them costs seconds).
How long --help takes is measured by bench/bench_cli_help.py (CPU and wall time on a quiet machine): a timed
bound here failed CIs whenever four lanes shared two cores (CPU time grows with the contention too).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from launcher.cli import SUBCOMMANDS, HelpFormatter, build_parser
from tests.support.helpers import REPO, roformer_env

HEAVY_MODULES = ("torch", "deepspeed", "transformers", "matplotlib")
# Every command line whose --help is checked: each subcommand, and the actions of `data`.
COMMANDS = [[name] for name in SUBCOMMANDS] + [["data", "prepare"], ["data", "tokenizer"], ["data", "upload"]]
# A fresh interpreter runs `roformer WORDS --help` as `python -m launcher` does, then reports which heavy modules
# that imported (parsing, building the parser, formatting the help).
_PROBE = f"""
import io, json, runpy, sys
from contextlib import redirect_stdout
sys.argv = ["roformer", *sys.argv[1:], "--help"]
help_text = io.StringIO()
try:
    with redirect_stdout(help_text):
        runpy.run_module("launcher", run_name="__main__", alter_sys=True)
except SystemExit as stop:
    assert stop.code in (0, None), stop.code
print(json.dumps({{"help": help_text.getvalue(), "imported": [m for m in {HEAVY_MODULES!r} if m in sys.modules]}}))
"""


def _subparsers(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    """(command words, parser) of every leaf parser below `parser`."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix, parser
        return
    for name, child in subs[0].choices.items():
        yield from _subparsers(child, (*prefix, name))


def _leaf_parsers():
    """(command words, parser) of every subcommand, each built on its own as `roformer` does."""
    for name in SUBCOMMANDS:
        yield from ((words, parser) for words, parser in _subparsers(build_parser([name])) if words[0] == name)


def _option_help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    return parser._get_formatter()._expand_help(action) if action.help else ""


def test_every_option_of_every_subcommand_is_described_and_shows_its_default():
    missing_help, missing_default, leaves = [], [], []
    for words, parser in _leaf_parsers():
        leaves.append(" ".join(words))
        assert parser.formatter_class is HelpFormatter, words
        # Options of a required either/or (plan's --world-size | --hostfile): one must be given.
        required_choice = {a for g in parser._mutually_exclusive_groups if g.required for a in g._group_actions}
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
                continue  # -h, and internal options hidden on purpose (e.g. --entry-module)
            where = f"roformer {' '.join(words)} {'/'.join(action.option_strings) or action.dest}"
            text = _option_help(parser, action)
            if len(text.strip()) < 8:
                missing_help.append(where)
            is_flag = action.nargs == 0  # store_true & co: present or not, nothing to default
            required = action.required or action in required_choice
            if action.option_strings and not is_flag and not required and "default" not in text.lower():
                missing_default.append(f"{where}: {text!r}")
    assert sorted(leaves) == sorted(" ".join(c) for c in COMMANDS if c != ["data"])
    assert not missing_help, "options without a description:\n" + "\n".join(missing_help)
    assert not missing_default, "options whose help shows no default:\n" + "\n".join(missing_default)


def test_defaults_are_the_values_the_options_really_get():
    # The formatter prints argparse's own default, so shown and applied cannot drift apart; these are
    # the ones the issue found missing (data prepare, eval-mlm).
    prepare = build_parser(["data"]).parse_args(["data", "prepare", "--input", "x", "--out", "o"])
    assert (prepare.workers, prepare.valid_fraction, prepare.shard_tokens) == (1, 0.01, 1 << 25)
    eval_mlm = build_parser(["eval-mlm"]).parse_args(["eval-mlm", "e", "--data", "d"])
    assert eval_mlm.seq_lens == "128,512,1024" and eval_mlm.tokens == 32768
    texts = {" ".join(words): " ".join(parser.format_help().split()) for words, parser in _leaf_parsers()}
    assert "(default: 128,512,1024)" in texts["eval-mlm"]
    assert "(default: 8000)" in texts["data prepare"]  # the tokenizer's vocabulary
    assert "(default: 1)" in texts["data prepare"]  # --workers


@pytest.mark.parametrize("words", COMMANDS, ids=" ".join)
def test_help_of_every_subcommand_imports_nothing_heavy(words):
    proc = subprocess.run([sys.executable, "-c", _PROBE, *words], cwd=REPO, env=roformer_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["help"].startswith(f"usage: roformer {' '.join(words)}"), answer["help"][:200]
    assert answer["imported"] == [], f"roformer {' '.join(words)} --help imported {answer['imported']}"

"""Every `roformer` subcommand's help: each option described with its default, answered at once.

The parsers are built the way `roformer` builds them (launcher.cli.build_parser, one subcommand at a
time), in a fresh interpreter each, so an import made while building them is seen. Speed: `--help`
of each subcommand in a subprocess: the CPU time (user + system of the child, load-independent) must
stay under 0.3 s, the wall-clock time (best of 3 runs, of 6 when all 3 were slow: other processes
share the machine) under 1 s.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import pytest

from launcher.cli import SUBCOMMANDS, HelpFormatter, build_parser
from tests.support.helpers import REPO, roformer_env

HELP_SECONDS = 0.3  # CPU time of one --help
# Every command line whose --help is checked: each subcommand, and the actions of `data`.
COMMANDS = [[name] for name in SUBCOMMANDS] + [["data", "prepare"], ["data", "tokenizer"], ["data", "upload"]]
# A fresh interpreter builds one subcommand's parser and reports which heavy modules that imported.
_PROBE = """
import json, sys
from launcher.cli import build_parser
build_parser([sys.argv[1]])
print(json.dumps({m: m in sys.modules for m in ("torch", "deepspeed", "transformers", "matplotlib")}))
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


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_building_a_subcommands_parser_imports_neither_torch_nor_deepspeed(name):
    proc = subprocess.run([sys.executable, "-c", _PROBE, name], cwd=REPO, env=roformer_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    imported = json.loads(proc.stdout)
    assert not any(imported.values()), f"roformer {name}: building its parser imported {imported}"


def _timed_help(words: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one `python -m launcher WORDS --help`; the child is reaped with
    os.wait4 to get its own CPU time."""
    start = time.perf_counter()
    pid = os.posix_spawn(sys.executable, [sys.executable, "-m", "launcher", *words, "--help"],
                         {**roformer_env(), "PYTHONPATH": str(REPO)},
                         file_actions=[(os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                                       (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0)])
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - start
    assert os.waitstatus_to_exitcode(status) == 0, words
    return wall, usage.ru_utime + usage.ru_stime


@pytest.mark.parametrize("words", COMMANDS, ids=" ".join)
def test_help_of_every_subcommand_answers_within_0_3_s(words):
    """0.3 s of CPU, the best of three: an eager torch import alone costs ~1.5 CPU-s. Wall time is printed, not
    asserted: with four lanes on two cores it waits for a core (it failed a CI at 1.0 s for all of six tries), and
    the CPU figure, which waiting does not change, already catches what the wall bound was for."""
    runs = [_timed_help(words) for _ in range(3)]
    wall, cpu = min(r[0] for r in runs), min(r[1] for r in runs)
    print(f"roformer {' '.join(words)} --help: best wall {wall:.3f} s, CPU {cpu:.3f} s")
    assert cpu < HELP_SECONDS, f"roformer {' '.join(words)} --help used {cpu:.2f} s of CPU"

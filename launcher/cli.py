"""The `roformer` command line.

Each subcommand's module exposes `configure(parser)` and `run(args) -> int`; only the chosen one is
imported, and importing it imports neither torch nor DeepSpeed, so every `--help` answers at once and a
broken optional dependency only breaks its own command. Every command ends the same way: bad input is one
line and exit 2, a signal exits 128 + its number without a traceback, a reader gone (`| head`) exits 141
(docs/training.md, "Exit codes of every command").
"""
from __future__ import annotations

import argparse
import importlib
import signal
import sys

from launcher.common.defaults import BAD_INPUT_EXIT_CODE, BROKEN_PIPE_EXIT_CODE, stop_signals_to_handle
from launcher.common.errors import UserError, user_errors
from launcher.flag_types import make_floats_finite
from launcher.common.io import reader_gone
from launcher.common.stop_mask import stops_held

# name -> (module, one-line help). The names are part of the public interface: docs and scripts
# rely on them.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "data": ("launcher.commands.data", "prepare corpora and train the SentencePiece tokenizer"),
    "plan": ("launcher.commands.plan", "validate a run config; per stage: batch arithmetic, memory (FITS?), time"),
    "pretrain": ("launcher.commands.pretrain", "staged MLM pretraining under DeepSpeed (single node or a hostfile)"),
    "export": ("launcher.commands.export", "export a checkpoint as a transformers RoFormer directory"),
    "eval-mlm": ("launcher.commands.eval_mlm", "masked-LM loss / accuracy / perplexity of an export at several lengths"),
    "finetune": ("launcher.commands.finetune", "fine-tune and evaluate an export on a labelled classification task"),
    "report": ("launcher.commands.report", "one-page report.md and PNG plots of a run (running or stopped)"),
    "reproduce": ("launcher.commands.reproduce", "reproduce the paper's claims at small scale: runs, plots, report"),
    "gpu-check": ("launcher.commands.gpu_check", "prove a CUDA machine: numerics vs fp32 and transformers, fp16 "
                  "pretraining + resume + export, speed, memory vs plan"),
}


class HelpFormatter(argparse.HelpFormatter):
    """Shows each option's default: "(default: X)" is appended unless the help text already says
    what the default is, or there is none to show (flags, required options, positionals). An
    option whose default is None or empty must say in its help what happens without it
    (tests/unit/test_cli_help.py checks every option of every subcommand)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        nothing_to_show = default is None or default is False or default in ([], "") or default is argparse.SUPPRESS
        if "default" in text.lower() or nothing_to_show or action.required or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


class OneLineParser(argparse.ArgumentParser):
    """A flag argparse refuses (a bad number, a missing or unknown option) is one line like every bad
    input, `roformer COMMAND: error: argument --lr: ...`, not the usage block; --help shows the usage."""

    def error(self, message: str):
        raise UserError(message)


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """The `roformer` parser for the arguments `argv`. Only the subcommand named in them gets its options;
    the others just need their name listed, so their modules are not imported."""
    parser = OneLineParser(prog="roformer", description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = next((a for a in argv if a in SUBCOMMANDS), None)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, formatter_class=HelpFormatter)
        if name == chosen:
            importlib.import_module(module_name).configure(p)
            make_floats_finite(p)
    return parser


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, raised by this command's handler. Not KeyboardInterrupt itself: CPython 3.11 marks the
    interpreter as killed by SIGINT when exactly that type leaves an exec() of a string (dataclasses and
    namedtuple build their methods so, at import), even when main catches it: the command then died by
    SIGINT instead of exiting 130."""


class Stopped(Exception):
    """SIGTERM or SIGHUP (a terminal or ssh session closing) reached a command that has no handler of its own."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_stops_received: list[int] = []
"""The stop signals this command got, in order (main clears it)."""


def _on_stop_signal(signum, _frame) -> None:
    """SIGINT as KeyboardInterrupt, SIGTERM as Stopped, and remembered: where the handler runs while Python
    finalises a generator or an object, the exception can only be printed ("Exception ignored in ...") and
    the work would go on to publish its result (issue 49)."""
    _stops_received.append(signum)
    _raise_stop(signum)


def _raise_stop(signum: int) -> None:
    if signum == signal.SIGINT:
        raise Interrupted
    raise Stopped(signum)


def raise_if_stopped() -> None:
    """Raise again a stop this command received: called before anything is published (a folder moved into
    place, an upload) and when a command returns, so a stop whose exception was swallowed still stops it."""
    if _stops_received:
        _raise_stop(_stops_received[0])


# Commands that use DeepSpeed import it first, without the parts they never run (launcher/deepspeed_env/lean_imports.py).
USE_DEEPSPEED = ("plan", "pretrain", "export", "gpu-check")
# Commands that compute with torch import it first too, with stops held (launcher/common/stop_mask.py).
USE_TORCH = USE_DEEPSPEED + ("eval-mlm", "finetune")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if a in SUBCOMMANDS), "")  # its errors while parsing name it too
    outputs: list[tuple[str, object]] = []  # (flag, path) the command writes: a full disk's line names them
    _stops_received.clear()
    # SIGTERM and SIGHUP unwind like Ctrl-C, so every `finally` (temporary files, worker pools) runs. SIGHUP's
    # default action killed the command silently (129) and left `roformer pretrain`'s ranks training without
    # it (issue 63); under `nohup` it stays ignored.
    hangup = [s for s in stop_signals_to_handle() if s == signal.SIGHUP]
    previous_hup = {s: signal.signal(s, _on_stop_signal) for s in hangup}
    previous = signal.signal(signal.SIGTERM, _on_stop_signal)
    # Ctrl-C as KeyboardInterrupt whatever this process inherited. A background job of a non-interactive
    # shell (`cmd &` in a script, CI runners, tools running commands detached) starts with SIGINT
    # *ignored*, and Python then installs no handler: a SIGINT sent to the command was silently dropped
    # and the work went on to the end (what made the Ctrl-C test of `data prepare` fail when the test
    # suite itself ran in the background).
    previous_int = signal.signal(signal.SIGINT, _on_stop_signal)
    try:
        parser = build_parser(argv)
        args = parser.parse_args(argv)
        command = args.command
        from launcher.outputs.gate import gate_parsed

        outputs = gate_parsed(parser, args)  # every path the command writes, by its declared kind, before it runs
        module = importlib.import_module(SUBCOMMANDS[command][0])
        with stops_held():
            if getattr(args, "from_run", None) is not None:  # plan --from-run reads records only: no torch
                pass
            elif command in USE_DEEPSPEED:
                from launcher.deepspeed_env.lean_imports import import_deepspeed

                import_deepspeed()
            elif command in USE_TORCH:
                import torch  # noqa: F401
        code = int(module.run(args) or 0)
        raise_if_stopped()
        sys.stdout.flush()  # a closed pipe shows here, not as a traceback at interpreter exit
        return code
    except KeyboardInterrupt:
        return _stopped(command, signal.SIGINT)
    except Stopped as stop:
        return _stopped(command, stop.signum)
    except BrokenPipeError:  # the reader of stdout is gone: no second error at the interpreter's final flush
        reader_gone(sys.stdout)
        return BROKEN_PIPE_EXIT_CODE
    # user_errors() imports the model config (dataclasses, inspect: ~20 ms of every --help), so only on an error.
    except Exception as err:  # noqa: BLE001
        if _stops_received:  # raised after a stop, by what the stop interrupted (a module half-imported): the stop
            return _stopped(command, _stops_received[0])
        if not isinstance(err, user_errors()):
            from launcher.common.size_checks import full_disk_line

            line = full_disk_line(err, outputs)
            if line is None:
                raise
            err = line  # a full disk: one line, like bad input
        print(f"{_prog(command)}: error: {err}", file=sys.stderr)  # bad input: one line, no traceback
        return BAD_INPUT_EXIT_CODE
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
        for signum, handler in previous_hup.items():
            signal.signal(signum, handler)


def _stopped(command: str, signum: int) -> int:
    name = signal.Signals(signum).name
    how = " (Ctrl-C)" if signum == signal.SIGINT else ""
    print(f"{_prog(command)}: stopped by {name}{how}", file=sys.stderr, flush=True)
    return 128 + signum


def _prog(command: str) -> str:
    """`roformer COMMAND`, or `roformer` when no command was named."""
    return f"roformer {command}" if command else "roformer"


if __name__ == "__main__":
    sys.exit(main())

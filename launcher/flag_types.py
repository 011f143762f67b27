"""argparse types of number flags: the range checked where the flag is parsed, so a bad value is one line
naming the flag (`argument --remote-timeout: must be > 0, got '0'`) before any work. Every `type=float` flag
is made finite by launcher/cli.py (Python's float() takes 'inf', 'nan' and '1e400')."""
from __future__ import annotations

import argparse
import math


def finite_float(text: str) -> float:
    """A float flag's value; inf and nan refused."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def positive_float(text: str) -> float:
    value = finite_float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def open_fraction(text: str) -> float:
    """A share strictly between 0 and 1 (finetune --dev-fraction: 0 holds out nothing, 1 leaves nothing to train)."""
    value = finite_float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be a number between 0 and 1 (exclusive), got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


MAX_SEED = 2**32 - 1
"""numpy's seeds are 32-bit (a run config's seeds are held to the same range: launcher/config/run_config.py)."""


def seed_int(text: str) -> int:
    """A seed flag's value, in [0, 2**32-1]: numpy refuses others with a traceback after the model is loaded."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, {MAX_SEED:,}], got {text!r}")
    return value


def make_floats_finite(parser: argparse.ArgumentParser) -> None:
    """Every `type=float` option of `parser` and of its subcommands (`data prepare`) parsed by finite_float
    instead (one rule for every command)."""
    for action in parser._actions:  # noqa: SLF001 - argparse keeps its actions only there
        if action.type is float:
            action.type = finite_float
        for subparser in (action.choices or {}).values() if isinstance(action, argparse._SubParsersAction) else ():
            make_floats_finite(subparser)

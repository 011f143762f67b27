"""Errors the launcher reports to the user as one clear line (no traceback)."""
from __future__ import annotations


class UserError(ValueError):
    """Bad input: a flag, a config field, a hostfile line, a run directory. The message names it."""


def user_errors() -> tuple[type[Exception], ...]:
    """Every bad-input error of the project (launcher, data pipeline, model config): one line, exit code 2."""
    from data_pipeline.errors import DataError
    from roformer.config import ConfigError

    return (UserError, DataError, ConfigError)

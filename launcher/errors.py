"""Errors the launcher reports to the user as one clear line (no traceback)."""


class UserError(ValueError):
    """Bad input: a flag, a config field, a hostfile line, a run directory. The message names it."""

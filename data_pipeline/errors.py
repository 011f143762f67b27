"""Errors about data shown to the user as one line: the message names the file (and line)."""


class DataError(ValueError):
    """Bad corpus, shard, manifest or tokenizer input."""

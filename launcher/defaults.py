"""Values that several parts of the launcher must agree on, defined once."""
from __future__ import annotations

BAD_INPUT_EXIT_CODE = 2
"""A command or rank refused its input (one line on stderr naming the problem)."""
ORDERLY_STOP_EXIT_CODE = 143
"""A rank stopped on SIGTERM/SIGINT after writing a checkpoint (128 + SIGTERM, as a shell reports it):
a requested stop, not a failure. The rank entry exits with it; the rank guard and the supervisor
recognise it."""
DEFAULT_MASTER_PORT = 29500
"""Rendezvous TCP port on rank 0's host: DeepSpeed's TORCH_DISTRIBUTED_DEFAULT_PORT."""

"""The `logging.stage_end_evals` entries of a run config, checked by the one place that knows them.

The eval job itself (export + eval-mlm / quick fine-tunes) is launcher.stage_evals.job. It is
reached only as a separate process (`python -m launcher.stage_evals.job`), so neither the run
config, the launcher nor the trainer imports the fine-tuning code; the job's `--check` mode is the
one place that knows which evals and options exist. Starting the job at a checkpoint:
launcher.stage_evals.start.
"""
from __future__ import annotations

import subprocess
import sys

from launcher.common.defaults import BAD_INPUT_EXIT_CODE
from launcher.common.errors import UserError

STAGE_EVALS_MODULE = "launcher.stage_evals.job"


def eval_args(specs: list[str]) -> list[str]:
    return [arg for spec in specs for arg in ("--eval", spec)]


def check_eval_specs(specs: list[str], where: str = "logging.stage_end_evals") -> None:
    """UserError naming `where` and the bad entry unless every spec is a known eval with valid options.
    Costs one short Python process, and only when evals are configured."""
    if not specs:
        return
    proc = subprocess.run([sys.executable, "-m", STAGE_EVALS_MODULE, "--check", "--where", where, *eval_args(specs)],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode == BAD_INPUT_EXIT_CODE:
        raise UserError(proc.stderr.strip().splitlines()[-1])
    if proc.returncode != 0:
        raise RuntimeError(f"checking {where} failed (exit code {proc.returncode}): {proc.stderr[-2000:]}")

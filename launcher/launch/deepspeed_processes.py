"""DeepSpeed's runner and per-node launcher as `roformer pretrain` starts them: DeepSpeed's own `main`s,
imported without MLflow, the launcher looking at its ranks more often.

DeepSpeed's autotuner imports MLflow whenever it is installed (the `track` extra: 1.5 s of pandas and
friends in every such process), and `roformer pretrain` never autotunes.
  python -m launcher.launch.deepspeed_processes runner ARGS   = python -m deepspeed.launcher.runner ARGS
  python -m launcher.launch.deepspeed_processes launch ARGS   = python -m deepspeed.launcher.launch ARGS
"""
from __future__ import annotations

import importlib
import sys
import time
import types

from launcher.common.process_exit import exit_without_finalizing
from launcher.deepspeed_env.lean_imports import import_deepspeed

MODULES = {"runner": "deepspeed.launcher.runner", "launch": "deepspeed.launcher.launch"}
LAUNCH_LOOK_SECONDS = 0.1
"""Between the per-node launcher's looks at its ranks. DeepSpeed's sleeps 1 s after each look, the last one
included, so every job (and every restart) ended up to 2 s after its ranks had (with the finalization of its
interpreter, 2.4 s of a 12.4 s tiny job: docs/training.md, "Start-up and exit")."""


class LauncherClock(types.ModuleType):
    """The `time` module as DeepSpeed's launch.py sees it: `sleep` (only its loop over the ranks sleeps) at most
    LAUNCH_LOOK_SECONDS; everything else is the real module's."""

    def __init__(self):
        super().__init__("time", "time, with sleep() capped at LAUNCH_LOOK_SECONDS (launcher.launch.deepspeed_processes)")

    def __getattr__(self, name: str):
        return getattr(time, name)

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(min(seconds, LAUNCH_LOOK_SECONDS))


def deepspeed_main(which: str):
    """DeepSpeed's `main` of `which` ("runner" or "launch"), its package imported lean."""
    import_deepspeed()  # the autotuner's MLflow import happens in DeepSpeed's package import
    module = importlib.import_module(MODULES[which])
    if which == "launch":
        module.time = LauncherClock()
    return module.main


def main(which: str, args: list[str]) -> None:
    sys.argv = [MODULES[which], *args]  # DeepSpeed's launch reads its arguments from sys.argv
    deepspeed_main(which)()


if __name__ == "__main__":  # without the interpreter's finalization: half a second of tearing down torch
    exit_without_finalizing(lambda: main(sys.argv[1], sys.argv[2:]))

"""DeepSpeed's runner and per-node launcher as `roformer pretrain` starts them: DeepSpeed's own `main`s,
imported without MLflow.

DeepSpeed's autotuner imports MLflow whenever it is installed (the `track` extra: 1.5 s of pandas and
friends in every such process), and `roformer pretrain` never autotunes.
  python -m launcher.launch.deepspeed_processes runner ARGS   = python -m deepspeed.launcher.runner ARGS
  python -m launcher.launch.deepspeed_processes launch ARGS   = python -m deepspeed.launcher.launch ARGS
"""
from __future__ import annotations

import importlib
import sys

from launcher.deepspeed_env.lean_imports import import_deepspeed

MODULES = {"runner": "deepspeed.launcher.runner", "launch": "deepspeed.launcher.launch"}


def main(which: str, args: list[str]) -> None:
    sys.argv = [MODULES[which], *args]  # DeepSpeed's launch reads its arguments from sys.argv
    import_deepspeed()  # the autotuner's MLflow import happens in DeepSpeed's package import
    importlib.import_module(MODULES[which]).main()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

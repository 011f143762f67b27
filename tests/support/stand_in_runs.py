"""A stand-in run directory for the report's tests: the records a run writes, without training one."""
from __future__ import annotations

import json
from pathlib import Path

from launcher.run_dir.layout import RunDir
from launcher.run_dir.metrics_format import format_event

TRAIN_STEPS = 20


def stand_in_run(root: Path, *events: dict) -> RunDir:
    """RUN_DIR at `root` holding logs/launcher.log (a run's own record: `report` reads only run directories) and a
    metrics.jsonl of TRAIN_STEPS train records (loss falling from 7.9 by 0.1 a step), then `events` as written."""
    run_dir = RunDir(root)
    run_dir.launcher_log.parent.mkdir(parents=True)
    run_dir.launcher_log.write_text("")
    records = [format_event()]
    records += [{"kind": "train", "step": step, "stage": 0, "loss": 8 - step / 10, "mlm_accuracy": 0.1, "lr": 1e-3,
                 "tokens_per_s": 100.0, "step_time_s": 0.5, "global_batch_size": 8, "max_seq_len": 16,
                 "masked_tokens": 10} for step in range(1, TRAIN_STEPS + 1)]
    run_dir.metrics.write_text("".join(json.dumps(record) + "\n" for record in [*records, *events]))
    return run_dir

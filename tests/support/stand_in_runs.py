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


def stand_in_schedule_run(root: Path, cfg, world_size: int = 2) -> RunDir:
    """RUN_DIR at `root` for the run config `cfg` (a RunConfig) at `world_size`, as if trained to its end: config.yaml
    and stages.json as a start records them (launcher/checkpoint/resume.py), and one train record per step carrying
    what the trainer writes of the schedule (global batch, LR, schedule_tokens, consumed_tokens), the loss falling."""
    import yaml

    from launcher.checkpoint.resume import stages_record
    from launcher.config.stages import entry_at, resolve_stages

    run_dir = RunDir(root)
    run_dir.launcher_log.parent.mkdir(parents=True)
    run_dir.launcher_log.write_text("")
    stages = resolve_stages(cfg, world_size)
    run_dir.config.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    run_dir.stages.write_text(json.dumps(stages_record(cfg, world_size, stages), indent=2))
    records = [format_event()]
    for step in range(cfg.schedule.total_steps):
        entry = entry_at(stages, step)
        tokens = entry.global_batch_size * entry.max_seq_len
        records.append({"kind": "train", "step": step + 1, "stage": entry.index, "loss": 8 - step / 100,
                        "mlm_accuracy": 0.1, "lr": cfg.learning_rate(step, entry.lr_scale), "tokens_per_s": 2.0 * tokens,
                        "step_time_s": 0.5, "global_batch_size": entry.global_batch_size,
                        "max_seq_len": entry.max_seq_len, "masked_tokens": tokens // 7,
                        "consumed_tokens": cfg.schedule.tokens_before(step + 1),
                        "schedule_tokens": cfg.schedule.tokens_before(step + 1)})
    run_dir.metrics.write_text("".join(json.dumps(record) + "\n" for record in records))
    return run_dir

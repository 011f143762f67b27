"""`roformer plan --config CFG --world-size N`: validate a run config for N ranks, print the stages.

Nothing is started and nothing is written; every error names the file, stage or field. The checks
are the ones every rank runs at start-up (launcher/config/preflight_checks.py): data, tokenizer
size, DeepSpeed config and precision.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from launcher.config.deepspeed_json import resolve_ds_config
from launcher.config.preflight_checks import check_run
from launcher.config.run_config import load_run_config
from launcher.config.stages import format_plan, resolve_stages
from launcher.stage_end_jobs import check_eval_specs


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="run config YAML (configs/)")
    parser.add_argument("--world-size", type=int, required=True, help="number of ranks (GPUs or CPU processes)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a run-config field (repeatable)")
    parser.add_argument("--json", action="store_true", help="print the stages and DeepSpeed config as JSON")


def run(args: argparse.Namespace) -> int:
    cfg = load_run_config(args.config, args.overrides)
    check_eval_specs(cfg.logging.stage_end_evals, where=f"{cfg.source}: logging.stage_end_evals")
    stages = resolve_stages(cfg, args.world_size)
    # The ranks' own start-up checks; DS_ACCELERATOR set here is what the ranks get (forwarded).
    checked = check_run(cfg, stages, args.world_size, accelerator_is_the_ranks="DS_ACCELERATOR" in os.environ)
    for note in checked.notes:
        print(f"roformer plan: note: {note}", file=sys.stderr)
    ds_config = resolve_ds_config(cfg, stages[0], args.world_size)
    if args.json:
        print(json.dumps({"stages": [s.to_dict() for s in stages], "deepspeed": ds_config}, indent=2))
        return 0
    print(format_plan(stages, args.world_size))
    print(f"deepspeed config: {cfg.deepspeed.config} (ZeRO stage "
          f"{ds_config.get('zero_optimization', {}).get('stage', 0)}, "
          f"{'fp16' if ds_config.get('fp16', {}).get('enabled') else 'bf16' if ds_config.get('bf16', {}).get('enabled') else 'fp32'})")
    return 0

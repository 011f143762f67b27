"""`roformer plan --config CFG --world-size N | --hostfile H`: validate a run config for N ranks, print
the stages and, per stage, the memory per rank (FITS / DOES NOT FIT the device) and the time
(launcher/pricing/estimate.py); `--json` prints the same as one JSON document.

Nothing is started and nothing is written; every error names the file, stage or field. The checks
are the ones every rank runs at start-up (launcher/inputs/run_checks.py): data, tokenizer
size, DeepSpeed config and precision.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.common.errors import UserError
from launcher.flag_types import positive_float
from launcher.launch.hostfile import read_hostfile
from launcher.stage_evals.specs import check_eval_specs

if TYPE_CHECKING:  # the estimator imports torch (through roformer): not at `roformer plan --help`
    from launcher.common.mfu import PlanMfu
    from launcher.pricing.estimate import StageEstimate, TrainingSetup


def configure(parser: argparse.ArgumentParser) -> None:
    # A value starting with '-' and a digit is a value ("--device-memory -5GB", refused with its range), not an
    # unknown flag ("expected one argument"): no flag of this command looks like that.
    parser._negative_number_matcher = re.compile(r"^-\.?\d")
    from launcher.outputs.gate import SUGGESTED_SCHEDULE, add_output

    parser.add_argument("--config", help="run config YAML (configs/); required unless --from-run (default: none)")
    parser.add_argument("--from-run", type=Path, metavar="RUN", help="instead of --config: print a schedule file "
                        "whose batch ramps follow the critical batch RUN measured (logging.noise_every; "
                        "launcher/pricing/from_run.py); nothing is started or changed (default: none)")
    add_output(parser, "--out", SUGGESTED_SCHEDULE, default=None, metavar="FILE",
               help="with --from-run: write the schedule file here (default: print it)")
    ranks = parser.add_mutually_exclusive_group()  # one of them unless --from-run (checked in run())
    ranks.add_argument("--world-size", type=int, help="number of ranks (GPUs or CPU processes); this or --hostfile "
                       "is required with --config (default: none)")
    ranks.add_argument("--hostfile", help="a hostfile: the world size is its slots' sum (default: none)")
    parser.add_argument("--exclude-nodes", default="", metavar="HOST[,HOST...]",
                        help="with --hostfile: the plan without these hosts, as `roformer pretrain "
                             "--exclude-failed-nodes` would restart without them (default: none)")
    parser.add_argument("--device-memory", help="memory per rank for the FITS verdicts, e.g. 16GB (default: the run "
                        "config's hardware.device, else this machine's accelerator's)")
    parser.add_argument("--device-name", help="price the run on this device of the peak table, e.g. V100 (with "
                        "--device-memory; default: the run config's hardware.device, else this machine's accelerator)")
    parser.add_argument("--peak-tflops", type=positive_float, help="peak TFLOP/s per rank for the time estimate (default: "
                        "from --device-name, logging.peak_tflops or this machine's accelerator)")
    parser.add_argument("--mfu", type=float, default=None, help="MFU for the time estimate (default: the one measured "
                        "for the device and precision, launcher/common/mfu.py MEASURED_MFU, else an assumed 0.4)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a run-config field (repeatable; default: none)")
    parser.add_argument("--json", action="store_true", help="print the stages, the DeepSpeed config and the "
                        "per-stage memory / time estimates as JSON")


def run(args: argparse.Namespace) -> int:
    if args.from_run is not None:
        return plan_from_run(args)
    if args.out is not None:
        raise UserError("--out: writes the schedule file of --from-run; a plan of --config prints only")
    if not args.config:
        raise UserError("--config: required (a run config YAML), or --from-run RUN")
    if args.world_size is None and not args.hostfile:
        raise UserError("--world-size or --hostfile: one of them is required with --config")
    if not args.json:
        return plan(args)
    with deepspeed_logs_to_stderr():  # stdout is the JSON's
        return plan(args)


def plan_from_run(args: argparse.Namespace) -> int:
    """--from-run RUN: the suggested schedule file (launcher/pricing/from_run.py), printed or written to --out."""
    from launcher.pricing.from_run import schedule_text, suggest_from_run

    given = [flag for flag, value in (("--config", args.config), ("--world-size", args.world_size),
                                      ("--hostfile", args.hostfile), ("--set", args.overrides)) if value]
    if given:
        raise UserError(f"--from-run: plans from the run's own records; drop {', '.join(given)}")
    stages, world_size = suggest_from_run(args.from_run)
    text = schedule_text(args.from_run, stages, world_size)
    if args.out is None:
        print(text, end="")
        return 0
    from launcher.common.io import atomic_write_text
    from launcher.outputs.gate import SUGGESTED_SCHEDULE
    from launcher.outputs.written import record_written

    atomic_write_text(args.out, text)
    record_written(args.out, SUGGESTED_SCHEDULE.name, SUGGESTED_SCHEDULE.made_by)
    print(f"roformer plan: schedule -> {args.out} (check it: roformer plan --config CFG --set schedule.file={args.out})",
          file=sys.stderr)
    return 0


@contextlib.contextmanager
def deepspeed_logs_to_stderr():
    """DeepSpeed's logger writes to stdout (e.g. its accelerator detection, at import): to stderr meanwhile."""
    imported_before = "deepspeed.utils" in sys.modules
    with contextlib.redirect_stdout(sys.stderr):  # a handler made by the first import takes sys.stdout
        from deepspeed.utils import logger
    handlers = [handler for handler in logger.handlers if isinstance(handler, logging.StreamHandler)]
    previous = [_swap_stream(handler, sys.stderr) for handler in handlers]
    try:
        yield
    finally:
        for handler, stream in zip(handlers, previous):  # as they were, or where a first import puts them
            _swap_stream(handler, stream if imported_before else sys.stdout)


def _swap_stream(handler: logging.StreamHandler, stream):
    """handler.setStream without flushing a stream that was closed meanwhile (a finished capture in
    one process that plans twice, as the tests do); returns the previous stream."""
    previous = handler.stream
    if getattr(previous, "closed", False):
        handler.stream = stream
    else:
        handler.setStream(stream)
    return previous


def plan(args: argparse.Namespace) -> int:
    # Imported here: the run config imports torch (through roformer), `roformer plan --help` must not wait.
    from launcher.config.deepspeed_json import DeepSpeedJson
    from launcher.resolved.stage_configs import resolve_ds_config
    from launcher.config.stages import format_plan
    from launcher.deepspeed_env.node_check import planned_optimizer
    from launcher.resolved.init_from import load_config_and_init
    from launcher.resolved.run_stages import stages_at

    cfg, init = load_config_and_init(args.config, args.overrides)
    check_eval_specs(cfg.logging.stage_end_evals, where=f"{cfg.source}: logging.stage_end_evals")
    ds_json = DeepSpeedJson.of(cfg)  # read once: the auto micro-batch's memory plan, the checks, the estimate
    if args.exclude_nodes and not args.hostfile:
        raise UserError("--exclude-nodes needs --hostfile (with --world-size, give the smaller world size itself)")
    if args.hostfile:
        hostfile = read_hostfile(args.hostfile)
        dropped = [name.strip() for name in args.exclude_nodes.split(",") if name.strip()]
        unknown = [name for name in dropped if name not in hostfile.slots_by_host]
        if unknown:
            raise UserError(f"--exclude-nodes: {', '.join(unknown)} not in {args.hostfile} "
                            f"(hosts: {', '.join(hostfile.slots_by_host)})")
        args.world_size = sum(slots for name, slots in hostfile.slots_by_host.items() if name not in dropped)
        if dropped:
            if not args.world_size:
                raise UserError(f"--exclude-nodes: no host of {args.hostfile} left")
            print(f"roformer plan: without {', '.join(dropped)}: world size {args.world_size}", file=sys.stderr)
    try:
        stages = stages_at(cfg, args.world_size, ds_json)
    except UserError as err:
        if not args.exclude_nodes:
            raise
        raise UserError(f"without {args.exclude_nodes}: world size {args.world_size} does not fit the schedule "
                        f"(a restart with --exclude-failed-nodes would be refused): {err}") from None
    notes, manifest = plan_checks(cfg, init, stages, args.world_size, ds_json,
                                  declared=bool(cfg.hardware.device or args.device_name))
    for note in notes:
        print(f"roformer plan: note: {note}", file=sys.stderr)
    ds_config = resolve_ds_config(cfg, stages[0], args.world_size, ds_json)
    estimates = plan_estimates(args, cfg, ds_json, stages)
    sources = plan_sources(stages, manifest)
    if args.json:
        print(json.dumps({"world_size": args.world_size, "stages": [s.to_dict() for s in stages],
                          "deepspeed": ds_config, "data_sources": sources.to_dict() if sources else None,
                          **({"estimate": estimates.to_dict()} if isinstance(estimates, PlanEstimates) else
                             {"estimate": None, "estimate_note": estimates})}, indent=2))
        return 0
    print(format_plan(stages, args.world_size, cfg))
    if sources is not None:
        print(sources.table())
    print(estimates.table() if isinstance(estimates, PlanEstimates) else f"memory and time: not estimated: {estimates}")
    print(f"deepspeed config: {cfg.deepspeed.config} (ZeRO stage {ds_json.zero_stage}, {ds_json.precision})")
    print(f"optimizer: {planned_optimizer(ds_json.config)}")
    return 0


@dataclass
class PlanEstimates:
    """Memory and time per stage (launcher/pricing/estimate.py) with the device and peak they assume."""

    setup: TrainingSetup
    """Model, world size, ZeRO stage, precision, activation checkpointing, CPU or accelerator ranks."""
    stages: list[StageEstimate]
    """One per stage of the schedule."""
    device_bytes: int
    peak_tflops: float
    peak_source: str
    mfu: PlanMfu
    """The MFU time is priced at, per sequence length, and its source (measured / assumed / --mfu)."""
    device: str = ""
    """The device priced on and where it came from (launcher/pricing/target.py), e.g. 'V100 16 GiB (hardware.device)'."""

    def table(self) -> str:
        from launcher.pricing.estimate import format_estimates

        return f"on {self.device}: " + format_estimates(self.stages, self.setup, self.device_bytes, self.peak_tflops, self.peak_source,
                                self.mfu)

    def to_dict(self) -> dict:
        setup = self.setup
        return {"zero_stage": setup.zero_stage, "precision": setup.precision,
                "activation_checkpointing": setup.activation_checkpointing, "cpu_ranks": setup.cpu_ranks,
                "device": self.device, "device_memory_bytes": self.device_bytes,
                "peak_tflops": self.peak_tflops, "peak_source": self.peak_source, "mfu": self.mfu.to_dict(),
                "all_fit": all(stage.fits for stage in self.stages),
                "total_seconds": sum(stage.seconds for stage in self.stages),
                "stages": [stage.to_dict() for stage in self.stages]}


def plan_checks(cfg, init, stages, world_size: int, ds_json, declared: bool = False) -> tuple[list[str], dict | None]:
    """The ranks' own start-up checks (launcher/inputs/run_checks.py; DS_ACCELERATOR set here is what
    the ranks get: forwarded): (their notes, the data's manifest as they read it). A plan for a declared device
    (hardware.device, --device-name) is about that device: this machine's precision support is not asked (the
    declared device's is, by its peak: V100 has no bf16). Sizing a cluster comes before
    preparing its corpus: without data.data_dir the model, schedule and DeepSpeed configs are checked, a note
    says the data was not, and there is no manifest."""
    from pathlib import Path

    from launcher.inputs.run_checks import check_run
    from launcher.resolved.run_setup import check_deepspeed_configs

    here = None if declared else "DS_ACCELERATOR" in os.environ
    if not cfg.data.is_remote and not Path(cfg.data.data_dir).is_dir():
        return [*check_deepspeed_configs(cfg, stages, world_size, ds_json, here)[3],
                f"data.data_dir {cfg.data.data_dir} does not exist (yet): the data was not checked (its tokenizer "
                f"against model.vocab_size, one global batch per stage); roformer pretrain checks it before starting"
                ], None
    findings = check_run(cfg, stages, world_size, init=init, accelerator_is_the_ranks=here, ds_json=ds_json)
    return findings.notes, findings.manifest


def plan_sources(stages, manifest: dict | None):
    """Tokens per stage and source and the passes over each source (launcher/config/source_plan.py), from the
    manifest the checks read; None when the data is not there yet (plan_checks said so)."""
    from data_pipeline.manifest import manifest_sources
    from launcher.config.source_plan import source_plan

    return None if manifest is None else source_plan(stages, manifest_sources(manifest))


def plan_estimates(args: argparse.Namespace, cfg, ds_json, stages) -> PlanEstimates | str:
    """The estimates of every stage on the flags' device, else the run config's target (hardware.device),
    else this machine's (launcher/pricing/target.py), in the DeepSpeed JSON's precision (as read once:
    DeepSpeedJson), at the MFU measured for that device and precision (else assumed, or --mfu); a note (str)
    when there is nothing to price on."""
    from launcher.common.mfu import plan_mfu
    from launcher.pricing.estimate import estimate_stages, setup_from_configs
    from launcher.pricing.target import NoTarget, resolve_target

    if args.mfu is not None and not 0 < args.mfu <= 1:
        raise UserError(f"--mfu: must be in (0, 1], got {args.mfu}")
    target = resolve_target(cfg, ds_json.precision, device_name=args.device_name, device_memory=args.device_memory,
                            peak_tflops=args.peak_tflops)
    if isinstance(target, NoTarget):
        return target.note
    mfu = plan_mfu(target.product, ds_json.precision, args.mfu)
    setup = setup_from_configs(cfg.model, ds_json, args.world_size, cfg.schedule.activation_checkpointing,
                               target.cpu_ranks)
    estimates = estimate_stages(stages, setup, target.device_bytes, target.peak_tflops, mfu)
    return PlanEstimates(setup, estimates, target.device_bytes, target.peak_tflops, target.peak_source, mfu,
                         target.label)

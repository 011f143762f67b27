"""`roformer pretrain`: staged pretraining on this machine or on the hosts of a hostfile.

    roformer pretrain --num_gpus 2 --config configs/demo_cpu.yaml --run-dir runs/demo

A thin wrapper around DeepSpeed's runner (on one machine, the per-node launcher the runner would start):
before anything starts it checks what DeepSpeed would only find out on the nodes (hostfile, batch arithmetic, forwarded variables, the ranks' own input checks, ssh and the
shared run directory); while it runs, launcher.launch.supervise names a failure and stops the whole job;
with --max-restarts it starts it again (docs/unattended.md). Multi-node set-up: docs/multinode.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
from pathlib import Path

from launcher.cli import raise_if_stopped
from launcher.common.defaults import DEFAULT_MASTER_PORT, PROGRESS_ENV
from launcher.common.errors import UserError
from launcher.run_dir.lock import LOCK_ID_ENV
from launcher.common.io import atomic_write_text, keep_console, write_line
from launcher.launch import env_forwarding
from launcher.launch.hostfile import is_local_only
from launcher.launch.launch_plan import add_launch_arguments, build_plan
from launcher.launch.ports import check_port_free


def configure(parser: argparse.ArgumentParser) -> None:
    add_launch_arguments(parser)
    parser.add_argument("--init-from", action=InitFromAction, metavar="DIR", default=None,
                        help="continue pretraining from this model directory: a `roformer export` or any transformers "
                             "RoFormer directory (= --set init_from=DIR; docs/training.md#continuing-from-an-existing-"
                             "model) (default: the run config's init_from, else random weights)")
    parser.add_argument("--branch-from", action=BranchFromAction, metavar="RUN_DIR[:TAG]", default=None,
                        help="start this new run at another run's checkpoint (weights, optimizer state, data position, "
                             "RNG), then follow --config's schedule, which must be the source's up to that step "
                             "(= --set branch_from=RUN_DIR[:TAG]; docs/training.md#branching-a-decay) (default: the run "
                             "config's branch_from, else no branch; TAG default: the source's newest complete "
                             "checkpoint)")
    parser.add_argument("--report-to", action=ReportToAction, metavar="LIST", default=None,
                        help="comma-separated trackers beside metrics.jsonl: tensorboard, mlflow, wandb, or none "
                             "(= --set logging.report_to=[...]; docs/training.md#trackers) (default: the run config's "
                             "logging.report_to, else tensorboard)")


class InitFromAction(argparse.Action):
    """--init-from DIR is the run config's `init_from`: an override every rank gets (like --set), with
    DIR made absolute here, where it was typed relative to the working directory."""

    def __call__(self, parser, namespace, value, option_string=None):
        from launcher.common.local_paths import refuse_url

        refuse_url("--init-from", value)  # before resolve() makes s3://b/m a local ./s3:/b/m
        setattr(namespace, self.dest, value)
        item = f"init_from={json.dumps(str(Path(value).expanduser().resolve()))}"  # JSON is YAML: any path
        namespace.overrides = [*(getattr(namespace, "overrides", None) or []), item]


class ReportToAction(argparse.Action):
    """--report-to mlflow,wandb is the run config's `logging.report_to`, checked here (one line, exit 2)."""

    def __call__(self, parser, namespace, value, option_string=None):
        from launcher.config.report_to import parse_report_to

        names = list(parse_report_to(value, "--report-to")) or ["none"]
        setattr(namespace, self.dest, value)
        namespace.overrides = [*(getattr(namespace, "overrides", None) or []), f"logging.report_to={json.dumps(names)}"]


class BranchFromAction(argparse.Action):
    """--branch-from RUN_DIR[:TAG] is the run config's `branch_from`, with RUN_DIR made absolute here (like
    --init-from)."""

    def __call__(self, parser, namespace, value, option_string=None):
        from launcher.config.branch_from import BranchFrom

        setattr(namespace, self.dest, value)
        item = f"branch_from={json.dumps(str(BranchFrom.parse(value, '--branch-from')))}"
        namespace.overrides = [*(getattr(namespace, "overrides", None) or []), item]


def run(args: argparse.Namespace) -> int:
    from launcher.outputs.output_paths import check_run_dir_target

    check_run_dir_target("--run-dir", args.run_dir)
    if args.max_restarts is not None and args.max_restarts < 0:
        raise UserError(f"--max-restarts {args.max_restarts}: must be >= 0")
    plan = build_plan(args)  # flags, hostfile, config: refused before the run directory is touched
    refuse_branch_into_its_source(plan)
    refuse_run_dir_inside_inputs(plan)
    notes = list(check_inputs(plan))  # data, bucket, port: a refusal here creates nothing, not even the lock
    if not plan.multi_node and not args.dry_run:  # this machine's rendezvous port, before any rank could fail on it
        check_port_free(plan.master_port)
    if args.master_port is None and not plan.multi_node:
        if plan.master_port != DEFAULT_MASTER_PORT:
            notes.append(f"rendezvous port {plan.master_port} ({DEFAULT_MASTER_PORT} is taken; --master_port "
                         "chooses one)")
        args.master_port = plan.master_port  # a restart's plan, built again from args, keeps the claimed port
    if args.dry_run:  # starts nothing, writes nothing: no lock; its plan says the schedule's warnings
        tell(notes, [])
        return plan_and_launch(args, plan)
    # From here a console that goes away ends nothing (the job's log keeps every line): before the first line,
    # which a closed console (an ssh session gone) would otherwise end with a broken pipe.
    keep_console()
    tell(notes, plan.run_config.schedule_warnings())
    with claim_run_dir(plan.run_dir) as lock:
        try:
            return plan_and_launch(args, dataclasses.replace(plan, env={**plan.env, LOCK_ID_ENV: lock.holder.lock_id}))
        finally:
            os.environ.pop(LOCK_ID_ENV, None)  # the job is over: no later command of this process inherits it


def tell(notes: list[str], warnings: list[str]) -> None:
    for note in notes:
        print(f"roformer pretrain: note: {note}", file=sys.stderr, flush=True)
    for warning in warnings:
        print(f"roformer pretrain: warning: {warning}", file=sys.stderr, flush=True)


def refuse_branch_into_its_source(plan) -> None:
    """A branch's source is only read: refused as --run-dir before the lock would write into it."""
    from launcher.config.branch_from import check_branch_target

    check_branch_target(plan.run_config, plan.run_dir)


def refuse_run_dir_inside_inputs(plan) -> None:
    """The run's records never go into (or around) what it reads: its prepared data, the model it starts
    from, the run it branches from (launcher/outputs/output_paths.py)."""
    from launcher.config.branch_from import BranchFrom
    from launcher.outputs.output_paths import check_paths

    cfg = plan.run_config
    branch = BranchFrom.parse(cfg.branch_from, cfg.source).run_dir if cfg.branch_from else None
    check_paths({"data.data_dir": None if cfg.data.is_remote else cfg.data.data_dir,
                 "--init-from": cfg.init_from or None, "--branch-from": branch}, {"--run-dir": plan.run_dir})


def claim_run_dir(run_dir: Path):
    """One job per run directory (launcher/run_dir/lock.py): a second job is refused here, in one line
    naming the holder, before anything is written. Held for the whole job, across restarts of its
    ranks; its id reaches the ranks (rank 0 checks it) in the plan's environment, and through this
    process's environment in every plan built again for a restart (ROFORMER_* variables are forwarded)."""
    from launcher.run_dir.lock import acquire

    lock = acquire(run_dir, command="roformer pretrain",
                   note=lambda text: print(f"roformer pretrain: note: {text}", file=sys.stderr, flush=True))
    os.environ[LOCK_ID_ENV] = lock.holder.lock_id
    return lock


def plan_and_launch(args: argparse.Namespace, plan) -> int:
    """The dry run's description, or the job (its inputs checked already)."""
    if args.dry_run:
        from launcher.pricing.target import dry_run_estimate
        from launcher.launch.node_commands import describe_plan

        print(describe_plan(plan))
        # Memory and time per rank on the run's target (hardware.device), as `roformer plan` prices it.
        print(dry_run_estimate(plan.run_config, plan.stages, plan.world_size, plan.ds_json))
        return 0

    from launcher.launch.restart_loop import RestartPolicy, run_with_restarts

    section = plan.run_config.restarts
    policy = RestartPolicy.from_args(args, section)
    def launch(this_plan):
        return launch_once(this_plan, section.preemption_grace_seconds)

    if policy.max_restarts == 0:
        return launch(plan).returncode
    return run_with_restarts(plan, policy, launch, rebuild=lambda drop: build_plan(args, drop_hosts=drop),
                             say=lambda text: say(plan, text))


def say(plan, text: str) -> None:
    """A line of the restart loop: on the console and in RUN_DIR/logs/launcher.log, as the job's own notes."""
    from launcher.run_dir.layout import RunDir

    write_line(text, sys.stdout)  # a console gone between two launches ends nothing (launcher/common/io.py)
    log = RunDir(plan.run_dir).launcher_log
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a", encoding="utf-8") as f:
            f.write(text + "\n")
    except OSError:
        pass  # the console has it; a log that cannot be written is no reason to stop the restart


def launch_once(plan, grace_seconds: float):
    """Pre-flight, the files the ranks read, then one launch supervised to its end (a JobOutcome)."""
    from launcher.launch import preflight
    from launcher.launch.console import Console
    from launcher.launch.supervise import supervise_job
    from launcher.run_dir.layout import RunDir

    master_addr = preflight.run_preflight(plan)
    node_env = preflight.check_nodes(plan)  # each node's wheel against its GPUs; FusedAdam or torch's AdamW
    # Rank 0 draws a status line only for a terminal (launcher/train/progress_line.py); a pipe or a file
    # gets plain progress lines, each once.
    status = sys.stdout.isatty()
    plan = dataclasses.replace(plan, master_addr=master_addr,
                               env={**plan.env, **node_env, PROGRESS_ENV: "status" if status else "lines"})
    env_file = env_forwarding.write_env_file(plan.run_dir, plan.env)
    if plan.multi_node:
        atomic_write_text(plan.hostfile_copy, plan.hostfile.render())

    runner_env = {**os.environ, **plan.env, "DS_ENV_FILE": str(env_file)}
    log = RunDir(plan.run_dir).launcher_log
    console = Console(sys.stdout, log, status=status, hosts=plan.resources)
    try:
        console.note(f"roformer pretrain: world size {plan.world_size} on {', '.join(plan.resources)} "
                     f"({plan.launcher}); run dir {plan.run_dir}; all output also in {log}", stream=console.out)
        console.log_only("roformer pretrain: " + shlex.join(plan.command()))
        raise_if_stopped()  # a stop whose exception was swallowed (an import it interrupted): nothing is launched
        return supervise_job(plan, runner_env, console, grace_seconds=grace_seconds)
    finally:
        console.close()


def check_inputs(plan) -> list[str]:
    """The checks every rank runs at start-up (launcher/inputs/run_checks.py: data, tokenizer
    size, DeepSpeed config, precision), here before anything starts. The accelerator is the ranks'
    when they run on this machine or DS_ACCELERATOR is set (they inherit it)."""
    from launcher.inputs.run_checks import check_run  # imports torch: not at `--help` time

    here = is_local_only(plan.resources) or "DS_ACCELERATOR" in plan.env
    return check_run(plan.run_config, plan.stages, plan.world_size, init=plan.init, accelerator_is_the_ranks=here,
                     run_dir=plan.run_dir, ds_json=plan.ds_json).notes

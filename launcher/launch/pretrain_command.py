"""`roformer pretrain`: staged pretraining on this machine or on the hosts of a hostfile.

    roformer pretrain --num_gpus 2 --config configs/demo_cpu.yaml --run-dir runs/demo
    roformer pretrain --hostfile hostfile --config configs/reference_v100.yaml --run-dir /shared/runs/r1

A thin wrapper around DeepSpeed's runner (`python -m deepspeed.launcher.runner`), which does the
launching (locally, or through pdsh / OpenMPI / MPICH / Slurm). Before anything starts we check
what DeepSpeed would only find out on the nodes: the hostfile and host filters
(launcher.launch.hostfile), the batch arithmetic of every stage at the resulting world size and the
variables forwarded to the ranks (launcher.launch.launch_plan), the ranks' own start-up checks of the
data and the DeepSpeed config (launcher.config.preflight_checks), then ssh reachability and the shared
run directory (launcher.launch.preflight). While it runs, launcher.launch.supervise names the node and rank of a
failure and makes sure the whole job stops. Multi-node set-up: docs/multinode.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys

from launcher.io import atomic_write_text
from launcher.launch import env_forwarding
from launcher.launch.hostfile import is_local_only
from launcher.launch.launch_plan import add_launch_arguments, build_plan


def configure(parser: argparse.ArgumentParser) -> None:
    add_launch_arguments(parser)


def run(args: argparse.Namespace) -> int:
    plan = build_plan(args)
    for note in check_inputs(plan):
        print(f"roformer pretrain: note: {note}", file=sys.stderr, flush=True)
    if args.dry_run:
        from launcher.launch.node_commands import describe_plan

        print(describe_plan(plan))
        return 0

    from launcher.launch import preflight
    from launcher.launch.supervise import supervise

    master_addr = preflight.run_preflight(plan)
    plan = dataclasses.replace(plan, master_addr=master_addr)
    env_file = env_forwarding.write_env_file(plan.run_dir, plan.env)
    if plan.multi_node:
        atomic_write_text(plan.hostfile_copy, plan.hostfile.render())

    runner_env = {**os.environ, **plan.env, "DS_ENV_FILE": str(env_file)}
    print(f"roformer pretrain: world size {plan.world_size} on {', '.join(plan.resources)} "
          f"({plan.launcher}); run dir {plan.run_dir}", flush=True)
    print("roformer pretrain: " + shlex.join(plan.runner_argv()), flush=True)
    return supervise(plan, runner_env)


def check_inputs(plan) -> list[str]:
    """The checks every rank runs at start-up (launcher/config/preflight_checks.py: data, tokenizer
    size, DeepSpeed config, precision), here before anything starts. The accelerator is the ranks'
    when they run on this machine or DS_ACCELERATOR is set (they inherit it)."""
    from launcher.config.preflight_checks import check_run  # imports torch: not at `--help` time
    from launcher.config.run_config import load_run_config

    cfg = load_run_config(plan.config_path, plan.overrides)
    here = is_local_only(plan.resources) or "DS_ACCELERATOR" in plan.env
    return check_run(cfg, plan.stages, plan.world_size, accelerator_is_the_ranks=here).notes

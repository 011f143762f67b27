"""The exact command each node will run, built by DeepSpeed's own runner classes (for --dry-run).

For pdsh, OpenMPI, MPICH and Slurm the command comes from DeepSpeed's `*Runner.get_cmd`, fed the
same arguments, world info and exports as `deepspeed.launcher.runner.main` would give it (the
export collection below mirrors main(): the runner's own prefixes first, then the env file). On one
machine `roformer pretrain` starts DeepSpeed's per-node launcher itself (LaunchPlan.local_launch_argv).
"""
from __future__ import annotations

import contextlib
import os
import shlex

from launcher.config.stages import format_plan
from launcher.launch import env_forwarding
from launcher.launch.launch_plan import SCRIPT_PATH_LAUNCHERS, LaunchPlan


def node_commands(plan: LaunchPlan) -> list[tuple[str, str]]:
    """(where, command) pairs: where is a host name or "this machine"."""
    from deepspeed.launcher import runner as ds_runner

    rank_lines = _rank_lines(plan)
    if not plan.multi_node:
        return [("this machine", _env_prefix(plan.env) + shlex.join(plan.local_launch_argv())), *rank_lines]

    runner_args = ds_runner.parse_args(plan.runner_argv()[5:])
    world_info = ds_runner.encode_world_info(plan.resources)
    if not runner_args.master_addr:
        first = next(iter(plan.resources))
        runner_args.master_addr = f"<first address of `ssh {first} hostname -I`>"
    env = {**os.environ, **plan.env}
    env["PYTHONPATH"] = str(env_forwarding.project_root()) + ":" + env.get("PYTHONPATH", "")
    with contextlib.chdir(env_forwarding.project_root()):  # PDSHRunner cds into the runner's cwd
        if plan.launcher == "pdsh":
            runner = ds_runner.PDSHRunner(runner_args, world_info)
        else:
            runner_class = ds_runner.LAUNCHER_CLASSES[plan.launcher]
            runner = runner_class(runner_args, world_info, plan.hostfile.slots_by_host)
        for key, value in runner_forwarded(plan, env).items():
            runner.add_export(key, value)
        for key, value in plan.env.items():  # what the runner reads from RUN_DIR/.deepspeed_env
            runner.add_export(key, value)
        if plan.launcher == "pdsh":
            cmd, _kill_cmd, _env = runner.get_cmd(env, plan.resources)
        else:
            cmd = runner.get_cmd(env, plan.resources)

    if plan.launcher != "pdsh":
        return [("this machine", shlex.join(cmd)), *rank_lines]
    pdsh_part = 6 + len(shlex.split(plan.launcher_args))  # pdsh -S -f N -w HOSTS [launcher args]
    remote = " ".join(cmd[pdsh_part:])  # pdsh joins its arguments into one remote shell command
    lines = [("this machine", shlex.join(cmd[:pdsh_part]) + " '<per-node command below>'")]
    for node_rank, host in enumerate(plan.resources):
        lines.append((host, remote.replace("%n", str(node_rank))))
    return lines + rank_lines


def _rank_lines(plan: LaunchPlan) -> list[tuple[str, str]]:
    """What each per-node launcher starts for every rank."""
    start = plan.runner_command if plan.launcher in SCRIPT_PATH_LAUNCHERS else ["-m", *plan.rank_command]
    command = shlex.join([plan.python, "-u", *start])
    # Where each rank's numbers come from (docs/multinode.md): DeepSpeed's launcher sets them for pdsh/local.
    source = {"local": "", "pdsh": "", "openmpi": " (from MPI discovery)",
              "mpich": " (from PMI_RANK/MPI_LOCALRANKID, by DeepSpeed's launcher_helper)",
              "slurm": " (from SLURM_PROCID/SLURM_LOCALID)"}[plan.launcher]
    return [(f"{host} rank {rank}", f"RANK={rank} LOCAL_RANK={local_rank}{source} {command}")
            for rank, host, local_rank in plan.rank_hosts()]


def runner_forwarded(plan: LaunchPlan, environ: dict[str, str] | None = None) -> dict[str, str]:
    """What DeepSpeed's runner exports to other nodes on its own (runner.EXPORT_ENVS: PYTHON*, MLFLOW*, MV2*,
    UCX*, plus the accelerator's own, NCCL* on CUDA) from the environment it runs in."""
    from deepspeed.launcher import runner as ds_runner

    environ = {**os.environ, **plan.env} if environ is None else environ
    prefixes = tuple(ds_runner.EXPORT_ENVS + _accelerator_export_prefixes())
    return {key: value for key, value in environ.items() if key.startswith(prefixes)}


def _env_prefix(env: dict[str, str]) -> str:
    return "".join(f"{key}={shlex.quote(value)} " for key, value in sorted(env.items()))


def _accelerator_export_prefixes() -> list[str]:
    from deepspeed.accelerator import get_accelerator

    return list(get_accelerator().export_envs())


def describe_plan(plan: LaunchPlan) -> str:
    """The --dry-run report: hosts, world size, batch arithmetic per stage, commands, environment."""
    hosts = ", ".join(f"{host} ({len(slots)} rank{'s' * (len(slots) != 1)})" for host, slots in plan.resources.items())
    source = plan.hostfile.path if plan.hostfile else "this machine (no --hostfile)"
    lines = [
        f"launcher: {plan.launcher}   hosts from {source}: {hosts}",
        f"world size: {plan.world_size}   master: {plan.master_addr or '(first host)'}:{plan.master_port}",
        f"config: {plan.config_path}   run dir: {plan.run_dir}",
        "",
        format_plan(plan.stages, plan.world_size, plan.run_config),
        "",
        "commands:",
    ]
    lines += [f"  [{where}] {command}" for where, command in node_commands(plan)]
    lines += ["", *describe_environment(plan)]
    if plan.multi_node:
        lines += ["", "not checked in a dry run: ssh reachability of each host, the shared run directory"]
    return "\n".join(lines)



def describe_environment(plan: LaunchPlan) -> list[str]:
    """Exactly the variables each node's ranks receive from this machine, and what each node computes itself."""
    if not plan.multi_node:
        return [f"environment of every rank: this shell's, plus ({plan.env_file}):",
                *(f"  {key}={value}" for key, value in sorted(plan.env.items()))]
    hosts = ", ".join(plan.resources)
    received = {**runner_forwarded(plan), **plan.env}
    lines = [f"environment each node ({hosts}) receives from this machine, and nothing else of it "
             f"({plan.env_file}, plus what DeepSpeed's runner forwards by itself: PYTHON*, UCX*, ...):"]
    lines += [f"  {key}={value}" for key, value in sorted(received.items())]
    lines += [f"  {key}=<redacted: a credential, not forwarded; each node reads its own (AWS_PROFILE, a credentials "
              f"file, an instance role)>" for key in env_forwarding.held_back_credentials(dict(os.environ))]
    if plan.launcher == "slurm":
        lines.append("  (slurm: DeepSpeed runs srun --export=ALL, which also passes this shell's whole environment)")
    lines.append("computed on each node when its ranks start (launcher/train/rank_entry.py), not forwarded:")
    lines += [f"  {key}: {how}" for key, how in env_forwarding.node_computed(plan.python)]
    return lines

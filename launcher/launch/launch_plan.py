"""What `roformer pretrain` will start, worked out (and checked) before anything runs.

A LaunchPlan is pure data: the validated hostfile, each host's slots, the world size, every stage's batch
arithmetic, the forwarded variables and the arguments for DeepSpeed's runner; `--dry-run` prints it. Each
rank runs `python -u -m launcher.launch.rank_process launcher.train.rank_entry --config CFG --run-dir RUN`
with the venv's Python, from the project root.
"""
from __future__ import annotations

import argparse
import base64
import dataclasses
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.common.defaults import DEFAULT_MASTER_PORT
from launcher.common.errors import UserError
from launcher.launch import env_forwarding
from launcher.config.guard_section import GUARD_ACTIONS
from launcher.launch.hostfile import Hostfile, is_local_only, read_hostfile, resolve_resources, world_size_of
from launcher.launch.ports import claim_default_port
from launcher.run_dir.layout import RunDir
from launcher.stage_evals.specs import check_eval_specs

if TYPE_CHECKING:  # the run config imports torch (through roformer): not needed for `roformer pretrain --help`
    from launcher.config.deepspeed_json import DeepSpeedJson
    from launcher.config.run_config import RunConfig
    from launcher.config.stages import ResolvedStage
    from launcher.resolved.init_from import InitSource

RANK_ENTRY_MODULE = "launcher.train.rank_entry"
RANK_PROCESS_MODULE = "launcher.launch.rank_process"
DEEPSPEED_PROCESSES = "launcher.launch.deepspeed_processes"  # DeepSpeed's runner and launch without MLflow
LAUNCHERS = ("pdsh", "openmpi", "mpich", "slurm")
MPI_LAUNCHERS = ("openmpi", "mpich")
# DeepSpeed's MPICH runner turns --module into `python -u -m <path of launcher_helper.py>` and its
# Slurm runner drops it (`python -u launcher.launch.rank_process`): both can start a script by path only.
SCRIPT_PATH_LAUNCHERS = ("mpich", "slurm")
# Per MPI launcher: what its `mpirun --version` prints (MPICH's process manager is Hydra), and the
# name Debian gives that MPI's own mpirun when both are installed.
MPIRUN_FLAVOURS = {"openmpi": ("Open MPI", "mpirun.openmpi"), "mpich": ("HYDRA", "mpirun.mpich")}
LOCAL_MASTER_ADDR = "127.0.0.1"
# pdsh hands its command to a remote shell and substitutes %n/%h/%u, and DeepSpeed quotes only
# arguments with spaces (in double quotes), so for pdsh every argument of the rank command must be
# made of characters no shell or pdsh treats specially.
SHELL_SAFE_CHARS = r"A-Za-z0-9_@+=:,./ -"
SHELL_SAFE_ARG_RE = re.compile(rf"[{SHELL_SAFE_CHARS}]*")


@dataclass
class LaunchPlan:
    """Everything about one launch; built by `build_plan` and never changed afterwards."""

    config_path: Path  # absolute run config (YAML)
    run_config: RunConfig  # that file with `overrides`, parsed once here; every rank parses it again itself
    init: InitSource | None  # run_config's init_from directory as its load read it (None without init_from)
    ds_json: DeepSpeedJson  # run_config's DeepSpeed JSON, read once here (the checks, --dry-run's estimate)
    run_dir: Path  # absolute run directory, shared by every node
    overrides: list[str]  # `--set section.key=value` items, passed to every rank unchanged
    hostfile: Hostfile | None  # None: local run on this machine
    resources: "OrderedDict[str, list[int]]"  # host -> slot ids, in global rank order
    world_size: int  # total ranks
    stages: list[ResolvedStage]  # every stage at world_size
    launcher: str  # "local" (DeepSpeed's launcher on this machine) or one of LAUNCHERS
    force_multi: bool  # tell DeepSpeed's runner to use `launcher` even for a single host
    master_addr: str  # rank 0's address; "" = DeepSpeed asks `ssh FIRST_HOST hostname -I`
    master_port: int  # rendezvous TCP port on rank 0's host
    launcher_args: str  # extra arguments for pdsh / mpirun / srun, one string as with deepspeed
    bind_cores_to_rank: bool  # numactl core binding per rank (DeepSpeed's --bind_cores_to_rank)
    bind_core_list: str | None  # cores to bind to, e.g. "0-15,32-47"
    env: dict[str, str]  # variables every rank gets (written to RUN_DIR/.deepspeed_env)
    entry_module: str = RANK_ENTRY_MODULE  # the per-rank training module
    python: str = field(default_factory=lambda: sys.executable)  # the venv's interpreter

    @property
    def multi_node(self) -> bool:
        return self.launcher != "local"

    @property
    def env_file(self) -> Path:
        return RunDir(self.run_dir).env_file

    @property
    def hostfile_copy(self) -> Path:
        """The validated hostfile as DeepSpeed's runner and mpirun read it."""
        return RunDir(self.run_dir).hostfile_copy

    @property
    def rank_args(self) -> list[str]:
        """Arguments of the training module (after `--config`); also identify the job's processes."""
        args = ["--config", str(self.config_path), "--run-dir", str(self.run_dir)]
        for item in self.overrides:
            args += ["--set", item]
        return args

    @property
    def rank_command(self) -> list[str]:
        """What DeepSpeed's launcher (or mpirun) starts for every rank, after `python -u -m`."""
        return [RANK_PROCESS_MODULE, self.entry_module, *self.rank_args]

    def rank_hosts(self) -> list[tuple[int, str, int]]:
        """(global rank, host, local rank) in rank order, as DeepSpeed's launcher numbers them."""
        out = []
        for host, slots in self.resources.items():
            for local_rank in range(len(slots)):
                out.append((len(out), host, local_rank))
        return out

    def command(self) -> list[str]:
        """What `roformer pretrain` starts (from the project root): on one machine DeepSpeed's per-node launcher,
        as DeepSpeed's runner would start it there (the runner only adds a process and 2 s); else the runner."""
        return self.runner_argv() if self.multi_node else self.local_launch_argv()

    def local_launch_argv(self) -> list[str]:
        """DeepSpeed's per-node launcher for every rank on this machine (the command `deepspeed.launcher.runner`
        builds for one node)."""
        world_info = base64.urlsafe_b64encode(json.dumps(self.resources).encode()).decode()
        argv = [self.python, "-u", "-m", DEEPSPEED_PROCESSES, "launch", f"--world_info={world_info}",
                f"--master_addr={LOCAL_MASTER_ADDR}", f"--master_port={self.master_port}", "--module",
                "--no_local_rank"]
        if self.bind_cores_to_rank:
            argv.append("--bind_cores_to_rank")
        if self.bind_core_list:
            argv.append(f"--bind_core_list={self.bind_core_list}")
        return argv + [*self.rank_command]

    def runner_argv(self) -> list[str]:
        """The full command for DeepSpeed's runner (run from the project root)."""
        argv = [self.python, "-u", "-m", DEEPSPEED_PROCESSES, "runner"]
        if self.multi_node:
            argv += ["--hostfile", str(self.hostfile_copy), "--launcher", self.launcher, "--no_ssh_check"]
            if self.force_multi:
                argv.append("--force_multi")
            if self.launcher not in MPI_LAUNCHERS:  # DeepSpeed's MPI runners refuse host/slot filters
                argv += _filter_flags(self.resources, self.hostfile)
        else:
            # A hostfile of localhost entries is resolved here; DeepSpeed gets none (os.devnull is
            # not a file, so it takes its local path) and just the number of local ranks.
            argv += ["--hostfile", os.devnull, "--num_gpus", str(self.world_size)]
        if self.launcher_args:
            argv += ["--launcher_args", self.launcher_args]
        if self.master_addr:
            argv += ["--master_addr", self.master_addr]
        argv += ["--master_port", str(self.master_port)]
        if self.launcher not in SCRIPT_PATH_LAUNCHERS:
            argv.append("--module")
        argv.append("--no_local_rank")
        if self.bind_cores_to_rank:
            argv.append("--bind_cores_to_rank")
        if self.bind_core_list:
            argv += ["--bind_core_list", self.bind_core_list]
        return argv + self.runner_command

    @property
    def runner_command(self) -> list[str]:
        """The rank command as DeepSpeed's runner gets it: the rank's wrapper by file path where it cannot take a module."""
        if self.launcher in SCRIPT_PATH_LAUNCHERS:
            return [importlib.util.find_spec(RANK_PROCESS_MODULE).origin, *self.rank_command[1:]]
        return self.rank_command


def _filter_flags(resources: "OrderedDict[str, list[int]]", hostfile: Hostfile | None) -> list[str]:
    """An --include naming exactly the resolved slots, so DeepSpeed resolves what we checked."""
    if hostfile is not None and resources == OrderedDict(
        (h.name, list(range(h.slots))) for h in hostfile.hosts
    ):
        return []
    spec = "@".join(f"{host}:{','.join(map(str, slots))}" for host, slots in resources.items())
    return ["--include", spec]


def add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags shared with `deepspeed` (same names and meaning) plus ours."""
    parser.add_argument("--config", required=True, help="run config YAML (e.g. configs/demo_cpu.yaml)")
    from launcher.outputs.gate import RUN_DIR, add_output

    add_output(parser, "--run-dir", RUN_DIR, required=True, help="run directory; on a filesystem shared by all nodes")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a run config field (repeatable; default: none); passed to every rank")
    parser.add_argument("--dry-run", action="store_true",
                        help="check everything that can be checked without starting anything, print each "
                        "node's command and every stage's batch arithmetic, exit")
    ds = parser.add_argument_group("DeepSpeed runner flags (same meaning as `deepspeed`)")
    ds.add_argument("-H", "--hostfile", default=None,
                    help="'HOST slots=N' per line (default: none, the ranks run on this machine)")
    ds.add_argument("-i", "--include", default="",
                    help='hosts/slots to use, e.g. "node1@node2:0,2" (default: every slot)')
    ds.add_argument("-e", "--exclude", default="", help='hosts/slots not to use, e.g. "node2:3" (default: none)')
    ds.add_argument("--num_nodes", "--num-nodes", type=int, default=-1,
                    help="use the first N hosts of the hostfile (default: -1, all of them)")
    ds.add_argument("--num_gpus", "--num-gpus", "--num_accelerators", type=int, default=-1,
                    help="ranks per node: GPUs, or CPU processes on a CPU machine (default: -1, every device "
                         "DeepSpeed's accelerator counts)")
    ds.add_argument("--master_addr", "--master-addr", default="",
                    help="rank 0's address (default: 127.0.0.1 locally, else `hostname -I` of the first host)")
    ds.add_argument("--master_port", "--master-port", type=int, default=None,
                    help=f"rendezvous TCP port on rank 0's host (default: {DEFAULT_MASTER_PORT}; on one machine the "
                         f"first free one from {DEFAULT_MASTER_PORT} up, claimed so that two jobs started at once "
                         "differ)")
    ds.add_argument("--launcher", default="pdsh", choices=LAUNCHERS, help="multi-node backend")
    ds.add_argument("--launcher_args", "--launcher-args", default="",
                    help='extra arguments for pdsh/mpirun/srun as one string, e.g. "--allow-run-as-root" '
                         '(default: none)')
    ds.add_argument("--force_multi", "--force-multi", action="store_true",
                    help="use --launcher even when the hostfile has a single host")
    ds.add_argument("--bind_cores_to_rank", "--bind-cores-to-rank", action="store_true",
                    help="bind each rank to its own cores with numactl")
    ds.add_argument("--bind_core_list", "--bind-core-list", default=None,
                    help='cores to bind with --bind_cores_to_rank, e.g. "0-15" (default: all of the node\'s)')
    unattended = parser.add_argument_group("unattended runs (docs/unattended.md; defaults: the run config's "
                                           "`restarts:` section)")
    unattended.add_argument("--max-restarts", type=int, default=None, metavar="N",
                            help="after a rank dies, a node's launcher exits, the hang watchdog stops the job or the "
                                 "ranks are preempted: start the job again from the newest intact checkpoint, up to N "
                                 "times, with a backoff (default: restarts.max_restarts, 0 = stop at the first failure)")
    unattended.add_argument("--exclude-failed-nodes", action="store_true", default=None,
                            help="restart without the node that failed or hung; every stage keeps its global batch "
                                 "(more gradient accumulation) or the restart is refused naming the stage "
                                 "(default: restarts.exclude_failed_nodes, false)")
    unattended.add_argument("--guard", action=GuardAction, choices=GUARD_ACTIONS, default=None, metavar="ACTION",
                            help="what the numerics guard does on a loss spike, a non-finite loss or gradient norm "
                                 "or a stuck fp16 loss scale: warn, stop, rewind (back to the checkpoint before the "
                                 "spike, skip its batches, go on) or off (= --set guard.action=ACTION; default: "
                                 "guard.action, rewind)")
    # Developer aid: the per-rank module (default launcher.train.rank_entry), not part of the user interface.
    parser.add_argument("--entry-module", default=RANK_ENTRY_MODULE, help=argparse.SUPPRESS)


class GuardAction(argparse.Action):
    """--guard ACTION is the run config's `guard.action`: an override every rank gets (like --set)."""

    def __call__(self, parser, namespace, value, option_string=None):
        setattr(namespace, self.dest, value)
        namespace.overrides = [*(getattr(namespace, "overrides", None) or []), f"guard.action={value}"]


def build_plan(args: argparse.Namespace, environ: dict[str, str] | None = None,
               drop_hosts: tuple[str, ...] = ()) -> LaunchPlan:
    """Check every flag, the hostfile, the config and the batch arithmetic; raise UserError naming the problem.
    `drop_hosts`: hostfile hosts left out (nodes excluded after a failure, launcher.launch.restart_loop)."""
    environ = dict(os.environ if environ is None else environ)
    if args.master_port is not None and not 1 <= args.master_port <= 65535:
        raise UserError(f"--master_port {args.master_port}: not a TCP port (1-65535)")
    if not re.fullmatch(r"[A-Za-z0-9_.]+", args.entry_module):
        raise UserError(f"--entry-module {args.entry_module!r}: not a Python module name")
    hostfile = read_hostfile(args.hostfile) if args.hostfile else None
    if hostfile is not None and drop_hosts:
        hostfile = without_hosts(hostfile, drop_hosts)
    explicit_launcher = args.launcher != "pdsh"
    if hostfile is None and (explicit_launcher or args.force_multi):
        raise UserError(
            f"--launcher {args.launcher}{' --force_multi' if args.force_multi else ''} needs a --hostfile "
            "(write 'localhost slots=N' to run it on this machine)"
        )
    if args.launcher in MPI_LAUNCHERS and (args.include or args.exclude or args.num_nodes >= 0 or args.num_gpus >= 0):
        raise UserError(
            f"--launcher {args.launcher} uses every slot of the hostfile (DeepSpeed's MPI runners refuse "
            "--include/--exclude/--num_nodes/--num_gpus); edit the hostfile instead"
        )
    resources = resolve_resources(
        hostfile, include=args.include, exclude=args.exclude, num_nodes=args.num_nodes,
        num_gpus=args.num_gpus, local_slots=_local_device_count() if hostfile is None else 1,
    )
    world_size = world_size_of(resources)
    local = is_local_only(resources) and len(resources) == 1
    multi_node = hostfile is not None and (not local or args.force_multi or explicit_launcher)
    launcher = args.launcher if multi_node else "local"
    master_addr = args.master_addr or (LOCAL_MASTER_ADDR if is_local_only(resources) else "")

    config_path = Path(args.config).resolve()
    run_dir = Path(args.run_dir).resolve()
    run_config, init, ds_json, stages = check_stages(config_path, list(args.overrides), world_size, resources,
                                                     hostfile)

    ranks_per_node = max(len(slots) for slots in resources.values())
    # Other nodes get only what they need; each computes its own PATH, op cache and thread count.
    env = env_forwarding.forwarded_environment(environ, ranks_per_node=ranks_per_node, local=launcher == "local")
    master_port = args.master_port
    if master_port is None:  # another node's ports cannot be tried from here: DeepSpeed's default there
        master_port = DEFAULT_MASTER_PORT if multi_node else claim_default_port(DEFAULT_MASTER_PORT)
    if launcher in MPI_LAUNCHERS + ("slurm",):
        # DeepSpeed's MPI discovery sets MASTER_PORT itself; ranks read this one (see docs/multinode.md).
        env["MASTER_PORT"] = str(master_port)
    plan = LaunchPlan(
        config_path=config_path, run_config=run_config, init=init, ds_json=ds_json, run_dir=run_dir, overrides=list(args.overrides), hostfile=hostfile,
        resources=resources, world_size=world_size, stages=stages, launcher=launcher,
        force_multi=multi_node and (len(resources) == 1 or args.force_multi), master_addr=master_addr,
        master_port=master_port, launcher_args=args.launcher_args,
        bind_cores_to_rank=args.bind_cores_to_rank, bind_core_list=args.bind_core_list, env=env,
        entry_module=args.entry_module,
    )
    if launcher == "pdsh":
        check_remote_shell_safe(plan, environ)
    if launcher in MPI_LAUNCHERS:
        check_mpirun_flavour(launcher, environ.get("PATH"))
    return plan


def without_hosts(hostfile: Hostfile, drop: tuple[str, ...]) -> Hostfile:
    """The hostfile less some hosts (the copy DeepSpeed's runner and mpirun read is rendered from it)."""
    kept = tuple(h for h in hostfile.hosts if h.name not in drop)
    if not kept:
        raise UserError(f"{hostfile.path}: no host left once {', '.join(drop)} are excluded")
    return dataclasses.replace(hostfile, hosts=kept)


def check_mpirun_flavour(launcher: str, path: str | None) -> None:
    """DeepSpeed's OpenMPI and MPICH runners both run plain `mpirun`: it must be that MPI's.

    Debian installs both MPIs side by side and `mpirun` is whichever the alternatives system picked
    (Open MPI by default); the other one fails only after start-up, on an option it does not know.
    """
    banner, own_name = MPIRUN_FLAVOURS[launcher]
    found = shutil.which("mpirun", path=path)
    if found is None:
        raise UserError(f"--launcher {launcher}: no `mpirun` on PATH (Debian: {own_name} is in package "
                        f"{'openmpi-bin' if launcher == 'openmpi' else 'mpich'})")
    try:
        version = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30,
                                 stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.TimeoutExpired) as err:
        raise UserError(f"--launcher {launcher}: `{found} --version` failed: {err}") from None
    if banner not in version:
        what = (version.strip().splitlines() or ["no version output"])[0]
        raise UserError(
            f"--launcher {launcher}: the `mpirun` on PATH is {found} ({what!r}), not {launcher}'s, and DeepSpeed's "
            f"{launcher} runner calls plain `mpirun`; put first on PATH a directory with an `mpirun` script "
            f"running `exec {own_name} \"$@\"`, or `update-alternatives --set mpirun /usr/bin/{own_name}`")


def _local_device_count() -> int:
    from deepspeed.accelerator import get_accelerator

    return max(1, get_accelerator().device_count())


def check_stages(config_path: Path, overrides: list[str], world_size: int, resources,
                 hostfile) -> tuple[RunConfig, InitSource | None, DeepSpeedJson, list[ResolvedStage]]:
    """Load the run config (the launch's one parse of it, with its init_from directory and DeepSpeed JSON read)
    and resolve every stage's batch arithmetic at this world size."""
    from launcher.config.deepspeed_json import DeepSpeedJson
    from launcher.resolved.init_from import load_config_and_init
    from launcher.resolved.run_stages import stages_at

    run_config, init = load_config_and_init(config_path, overrides)
    check_eval_specs(run_config.logging.stage_end_evals, where=f"{run_config.source}: logging.stage_end_evals")
    ds_json = DeepSpeedJson.of(run_config)
    try:
        # micro_batch_size auto: hardware.device, as on the ranks; else this machine's (the ranks size their own)
        return run_config, init, ds_json, stages_at(run_config, world_size, ds_json)
    except UserError as err:
        where = f"{hostfile.path}" if hostfile else "--num_gpus"
        hosts = ", ".join(f"{h} x{len(s)}" for h, s in resources.items())
        raise UserError(f"world size {world_size} ({where}: {hosts}) does not fit the schedule: {err}") from None


def check_remote_shell_safe(plan: LaunchPlan, environ: dict[str, str]) -> None:
    """pdsh runs the rank command through a remote shell: refuse anything it would interpret."""
    env_forwarding.check_shell_safe(plan.env, also_from=environ)
    named = {"--config": str(plan.config_path), "--run-dir": str(plan.run_dir),
             "project directory": str(env_forwarding.project_root()), "python": plan.python}
    named.update({f"--set {item}": item for item in plan.overrides})
    named["--master_addr"] = plan.master_addr
    for what, value in named.items():
        if not SHELL_SAFE_ARG_RE.fullmatch(value):
            bad = "".join(sorted(set(re.sub(rf"[{SHELL_SAFE_CHARS}]", "", value))))
            raise UserError(
                f"{what}: {value!r} contains {bad!r}; with the pdsh launcher it would pass through a remote "
                "shell, so only letters, digits, spaces and _@+=:,./- are allowed (edit the config file instead)"
            )
    # DeepSpeed's pdsh command quotes only the rank's arguments; these go in bare (`cd DIR; PYTHON ...
    # --master_addr=ADDR`), where a space would split them into other arguments.
    for what in ("project directory", "python", "--master_addr"):
        if " " in named[what]:
            raise UserError(f"{what}: {named[what]!r} contains a space, which DeepSpeed's pdsh command passes "
                            "unquoted to the remote shell; use a path/address without spaces")

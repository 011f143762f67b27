"""Run one rank as a child process and say which rank died, and how, if it fails.

    python -m launcher.launch.rank_process launcher.train.rank_entry --config CFG --run-dir RUN_DIR ...

A rank killed by SIGKILL cannot report itself and DeepSpeed's launcher does not name it, so this wrapper
prints one `[roformer-rank-exit] rank=.. host=.. status=..` line for `roformer pretrain`
(launcher.launch.supervise) and exits with the rank's status. It stops the rank (checkpoint, exit) when its
parent or the job's `roformer pretrain` dies (PR_SET_PDEATHSIG, and launcher.launch.launcher_watch), finds
the rank's numbers under mpirun / srun, and runs the hang watchdog (launcher.launch.watchdog) for a rank with
a `--run-dir`.
"""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time

from launcher.common.defaults import (BAD_INPUT_EXIT_CODE, DEFAULT_MASTER_PORT, HUNG_EXIT_CODE, ORDERLY_STOP_EXIT_CODE,
                               RANK_STOP_SIGNALS, stop_signals_to_handle)
from launcher.common.io import keep_console, write_line, write_line_kept
from launcher.launch.launch_plan import RANK_ENTRY_MODULE
from launcher.launch.launcher_watch import LauncherWatch
from launcher.launch.watchdog import Watchdog, run_dir_from_args
from launcher.run_dir.layout import RunDir
from launcher.run_dir.lock import LOCK_ID_ENV

MARKER = "[roformer-rank-exit]"
PR_SET_PDEATHSIG = 1
ORPHAN_STOP_SECONDS = 60.0
DISTRIBUTED_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
MPI_RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
# Set by srun for each task of a job step (a batch script or an salloc shell has no SLURM_STEP_NUM_TASKS).
SLURM_STEP_VARIABLES = ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_STEP_NODELIST")


def _rank_identity(env: dict[str, str]) -> dict[str, str]:
    """Rank numbers from DeepSpeed's launcher, OpenMPI, MPICH/PMI or Slurm, whichever started us."""

    def first(*names: str) -> str:
        return next((env[n] for n in names if n in env), "?")

    return {
        "rank": first("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"),
        "local_rank": first("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"),
        "node_rank": first("CROSS_RANK", "OMPI_COMM_WORLD_NODE_RANK", "SLURM_NODEID"),
        "host": socket.gethostname(),
    }


def describe_status(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def exit_line(identity: dict[str, str], pid: int, returncode: int) -> str:
    """The MARKER line naming a rank that ended badly (`roformer pretrain` parses it: launcher/launch/supervise.py)."""
    fields = " ".join(f"{k}={v}" for k, v in identity.items())
    return f"{MARKER} {fields} pid={pid} status={describe_status(returncode)}"


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM us when our parent exits (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def _start_rank_entry() -> None:
    """In the rank entry's process before it execs: die with us, and hold SIGTERM / SIGINT until its own
    handlers exist (launcher/train/stop_signals.py, which unblocks them), so a stop sent while its
    interpreter starts is delivered to them, not taken by the default action (which would kill it).
    Only for the rank entry: another module would never see them."""
    _die_with_parent()
    signal.pthread_sigmask(signal.SIG_BLOCK, RANK_STOP_SIGNALS)


def mpi_environment() -> dict[str, str]:
    """RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT for a rank started by mpirun.

    DeepSpeed's launcher sets these; mpirun (directly or through `--launcher openmpi`) does not.
    Then DeepSpeed's own MPI discovery (deepspeed.comm.comm.mpi_discovery, mpi4py) works them out
    here, with MASTER_PORT from our environment (it would otherwise default to 29500), and the rank
    gets them as plain variables. Empty when not under MPI or when they are already set.
    """
    if all(name in os.environ for name in DISTRIBUTED_VARIABLES):
        return {}
    if not any(name in os.environ for name in MPI_RANK_VARIABLES):
        return {}
    from deepspeed.comm.comm import mpi_discovery

    saved = dict(os.environ)
    mpi_discovery(distributed_port=int(os.environ.get("MASTER_PORT", DEFAULT_MASTER_PORT)), verbose=False)
    found = {name: os.environ[name] for name in DISTRIBUTED_VARIABLES}
    os.environ.clear()
    os.environ.update(saved)
    return found


def slurm_environment() -> dict[str, str]:
    """RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT for a rank started by srun.

    DeepSpeed's Slurm runner leaves rank discovery to mpi4py, which needs MPI wired to Slurm's PMI; Slurm
    already gives each task SLURM_PROCID, SLURM_STEP_NUM_TASKS and SLURM_LOCALID. Rank 0 runs on the step's
    first node (SLURM_STEP_NODELIST through `scontrol show hostnames`); our own MASTER_ADDR wins. Empty outside
    an srun step, under MPI (mpi_environment) or when the variables are already set.
    """
    if all(name in os.environ for name in DISTRIBUTED_VARIABLES):
        return {}
    if any(name in os.environ for name in MPI_RANK_VARIABLES):
        return {}
    if not all(name in os.environ for name in SLURM_STEP_VARIABLES):
        return {}
    master_addr = os.environ.get("MASTER_ADDR") or _first_slurm_host(os.environ["SLURM_STEP_NODELIST"])
    return {"RANK": os.environ["SLURM_PROCID"], "WORLD_SIZE": os.environ["SLURM_STEP_NUM_TASKS"],
            "LOCAL_RANK": os.environ["SLURM_LOCALID"], "MASTER_ADDR": master_addr,
            "MASTER_PORT": os.environ.get("MASTER_PORT", str(DEFAULT_MASTER_PORT))}


def _first_slurm_host(nodelist: str) -> str:
    """The first host of a Slurm host list such as `gpu[07-09],login1` (scontrol expands it)."""
    try:
        result = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                                stdin=subprocess.DEVNULL, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise RuntimeError(f"cannot expand SLURM_STEP_NODELIST={nodelist!r} with `scontrol show hostnames`: "
                           f"{err}; pass --master_addr") from None
    hosts = result.stdout.split()
    if result.returncode != 0 or not hosts:
        raise RuntimeError(f"cannot expand SLURM_STEP_NODELIST={nodelist!r} with `scontrol show hostnames`: "
                           f"{result.stderr.strip() or 'no output'}; pass --master_addr")
    return hosts[0]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-"):
        print("usage: python -m launcher.launch.rank_process MODULE [ARGS...]", file=sys.stderr)
        return 2
    parent = os.getppid()
    _die_with_parent()
    if os.getppid() != parent:  # the parent died before prctl took effect
        return 1

    stops: list[int] = []  # the stop signals received
    orphan_deadline: float | None = None
    child: subprocess.Popen | None = None

    def on_stop_signal(signum, _frame):
        # Every stop path (DeepSpeed's launcher, our pkill, a process-group signal) signals the rank
        # itself too; forwarding would make it a second signal, which the trainer takes as "stop now,
        # skip the checkpoint". Only when our parent is gone (PR_SET_PDEATHSIG) is nobody else
        # signalling the rank, so then we pass it on and give it ORPHAN_STOP_SECONDS.
        nonlocal orphan_deadline
        if child is not None and child.poll() is not None:
            return  # the rank had ended first (killed, failed): its end is reported as it was, not as this stop's
        stops.append(signum)
        if child is not None and os.getppid() != parent and orphan_deadline is None:
            child.send_signal(signum)
            orphan_deadline = time.monotonic() + ORPHAN_STOP_SECONDS

    # From the start, before the rank exists: a stop sent meanwhile (the whole process tree gets one) would
    # otherwise kill this wrapper by the default action, and the job would report a rank killed by a signal.
    for signum in stop_signals_to_handle():  # SIGHUP too (unless under nohup): a stop like SIGTERM
        signal.signal(signum, on_stop_signal)
    try:
        env = {**os.environ, **mpi_environment(), **slurm_environment()}
    except RuntimeError as err:
        print(f"rank_process: error: {err}", file=sys.stderr, flush=True)
        return BAD_INPUT_EXIT_CODE
    if stops or os.getppid() != parent:  # stopped, or our parent gone, before the rank exists: start none
        return 128 + stops[0] if stops else 1
    start = _start_rank_entry if argv[0] == RANK_ENTRY_MODULE else _die_with_parent
    child = subprocess.Popen([sys.executable, "-u", "-m", *argv], env=env, preexec_fn=start)
    identity = _rank_identity(env)
    watchdog = Watchdog.for_rank(argv[1:], env, identity, child.pid,
                                 report=write_line)
    if watchdog is not None:
        watchdog.start()
    run_dir = run_dir_from_args(argv[1:])
    launchers = LauncherWatch(parent, run_dir, env.get(LOCK_ID_ENV) or None)
    while child.poll() is None:
        time.sleep(0.2)
        gone = launchers.look() if orphan_deadline is None else None
        if gone is not None and child.poll() is None:  # nobody else will stop the rank: we do, as a SIGTERM
            if run_dir is not None:  # the console died with the launcher: the job's log keeps the line
                keep_console(RunDir(run_dir).launcher_log)
            write_line_kept(f"rank_process (rank {identity['rank']} on {identity['host']}): {gone}: stopping the "
                            f"rank (it finishes its step, writes a checkpoint and exits)")
            stops.append(signal.SIGTERM)
            child.send_signal(signal.SIGTERM)
            orphan_deadline = time.monotonic() + ORPHAN_STOP_SECONDS
        if orphan_deadline is not None and time.monotonic() > orphan_deadline:
            child.kill()
    returncode = child.returncode
    if watchdog is not None:
        watchdog.stop()
        if watchdog.verdict is not None:  # we killed it: the watchdog line said why
            return HUNG_EXIT_CODE
    if returncode not in (0, ORDERLY_STOP_EXIT_CODE) and not stops:
        write_line(exit_line(identity, child.pid, returncode))
    # A signal death becomes 128+N, as a shell reports it; DeepSpeed's launcher only checks != 0.
    return returncode if returncode >= 0 else 128 - returncode


if __name__ == "__main__":
    # Started by file path (DeepSpeed's MPICH and Slurm runners): Python put this file's directory
    # first on sys.path, where our module names would shadow top-level ones in later imports.
    if sys.path and os.path.realpath(sys.path[0]) == os.path.dirname(os.path.realpath(__file__)):
        del sys.path[0]
    sys.exit(main())

"""Run one rank as a child process and say which rank died, and how, if it fails.

    python -m launcher.rank_guard launcher.pretrain_rank --config CFG --run-dir RUN_DIR ...

A rank killed by SIGKILL (the OOM killer, a node problem) cannot report anything itself, and
DeepSpeed's per-node launcher only logs "exits with return code" for the last command it started,
not for the rank that failed. This guard sits between DeepSpeed's launcher (or mpirun) and the
rank, which it starts with the same Python. When the rank ends badly it prints one line

    [roformer-rank-exit] rank=1 local_rank=0 node_rank=1 host=gpu07 pid=4242 status=killed by SIGKILL

that `roformer pretrain` picks out of the (pdsh-prefixed) output to name the node and rank, and
then exits with the rank's status so DeepSpeed's launcher stops the node's other ranks as usual.
SIGTERM/SIGINT are passed on to the rank (those exits are not reported: they are the stop, not
the cause). If whoever started the guard dies, the kernel sends it SIGTERM (Linux
PR_SET_PDEATHSIG), so no rank outlives its launcher.
"""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys

MARKER = "[roformer-rank-exit]"
PR_SET_PDEATHSIG = 1


def _rank_identity() -> dict[str, str]:
    """Rank numbers from DeepSpeed's launcher, OpenMPI, MPICH/PMI or Slurm, whichever started us."""

    def first(*names: str) -> str:
        return next((os.environ[n] for n in names if n in os.environ), "?")

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


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM us when our parent exits (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-"):
        print("usage: python -m launcher.rank_guard MODULE [ARGS...]", file=sys.stderr)
        return 2
    parent = os.getppid()
    _die_with_parent()
    if os.getppid() != parent:  # the parent died before prctl took effect
        return 1

    stopping = False
    child = subprocess.Popen([sys.executable, "-u", "-m", *argv], preexec_fn=_die_with_parent)

    def forward(signum, _frame):
        nonlocal stopping
        stopping = True
        child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    returncode = child.wait()
    if returncode != 0 and not stopping:
        fields = " ".join(f"{k}={v}" for k, v in _rank_identity().items())
        print(f"{MARKER} {fields} pid={child.pid} status={describe_status(returncode)}", file=sys.stderr, flush=True)
    # A signal death becomes 128+N, as a shell reports it; DeepSpeed's launcher only checks != 0.
    return returncode if returncode >= 0 else 128 - returncode


if __name__ == "__main__":
    sys.exit(main())

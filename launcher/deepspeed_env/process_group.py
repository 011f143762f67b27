"""A process's DeepSpeed process group, without the shared memory DeepSpeed's CPU all-reduce leaves behind
(launcher/deepspeed_env/shm_buffer.py). Every process group of the launcher starts here: the ranks'
(launcher/train/rank.py) and `roformer gpu-check`'s in-process rank's (launcher/gpu_check/speed_memory.py).
"""
from __future__ import annotations

import deepspeed
from deepspeed.accelerator import get_accelerator

from launcher.deepspeed_env.shm_buffer import shm_allreduce_buffer


def init_distributed(backend: str | None = None, auto_mpi_discovery: bool = True) -> None:
    """DeepSpeed's process group (the accelerator's backend unless `backend`; ranks and addresses from the
    environment, as DeepSpeed's launcher sets them, else from MPI unless not `auto_mpi_discovery`), then this
    rank's all-reduce buffer name removed."""
    deepspeed.init_distributed(dist_backend=backend or get_accelerator().communication_backend_name(),
                               auto_mpi_discovery=auto_mpi_discovery)
    _unlink_shm_allreduce_buffer()


def _unlink_shm_allreduce_buffer() -> None:
    """Remove this rank's buffer NAME once every rank has mapped every peer's buffer (each rank's
    initialisation opens all peers before it returns; the barrier waits for all of them). The
    mappings stay valid until the processes exit, and the memory is freed with the last one, even
    when a rank is killed. A barrier that fails (a peer gone) ends the job: the name goes anyway."""
    try:
        deepspeed.comm.barrier()  # on every rank: whether a buffer exists is not a collective decision
    finally:
        shm_allreduce_buffer(deepspeed.comm.get_rank()).unlink(missing_ok=True)

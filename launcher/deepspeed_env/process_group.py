"""A process's DeepSpeed process group, without DeepSpeed's CPU shared-memory all-reduce op (never used in training:
launcher/deepspeed_env/lean_imports.py). Every process group of the launcher starts here: the ranks'
(launcher/train/rank.py) and `roformer gpu-check`'s in-process rank's (launcher/gpu_check/speed_memory.py).
"""
from __future__ import annotations

import deepspeed
from deepspeed.accelerator import get_accelerator

from launcher.deepspeed_env.lean_imports import skip_inference_all_reduce_op


def init_distributed(backend: str | None = None, auto_mpi_discovery: bool = True) -> None:
    """DeepSpeed's process group (the accelerator's backend unless `backend`; ranks and addresses from the
    environment, as DeepSpeed's launcher sets them, else from MPI unless not `auto_mpi_discovery`)."""
    skip_inference_all_reduce_op()
    deepspeed.init_distributed(dist_backend=backend or get_accelerator().communication_backend_name(),
                               auto_mpi_discovery=auto_mpi_discovery)

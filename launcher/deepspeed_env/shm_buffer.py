"""Where DeepSpeed's CPU all-reduce keeps a rank's shared memory, and its removal (standard library only: the rank
wrapper, launcher/launch/rank_process.py, imports it without torch).

DeepSpeed's CPU shared-memory all-reduce (ops/csrc/cpu/comm/shm.cpp, used when every rank of the job is on one
node: LOCAL_SIZE == world size) creates /dev/shm/<prefix>_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank> (~66 MB each)
at the process group's start and never removes it: /dev/shm is RAM. A process that starts the group through
launcher/deepspeed_env/process_group.py removes its name once every peer has mapped it (two test probes that
called DeepSpeed directly left 2 per suite run); a rank that dies before that (killed, or its peer gone during
the rendezvous) leaves it, and its wrapper removes it when the rank has ended."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

SHM_ALLREDUCE_PREFIX = "deepspeed_allreduce_buffer"


def shm_allreduce_buffer(rank: int, env: Mapping[str, str] = os.environ) -> Path:
    """Where DeepSpeed's CPU all-reduce keeps rank `rank`'s buffer of the job whose environment is `env`."""
    name = f"{SHM_ALLREDUCE_PREFIX}_{os.getuid()}_{env.get('MASTER_ADDR', '')}_{env.get('MASTER_PORT', '')}"
    return Path("/dev/shm") / f"{name}_{rank}"


def remove_ended_ranks_buffer(env: Mapping[str, str]) -> None:
    """The buffer of the rank that ran with `env` (RANK, MASTER_ADDR, MASTER_PORT), once that rank has ended: no
    peer can still need its name (every peer opened it before the rank could have removed it), and a restart on the
    same port must not find it."""
    if env.get("RANK", "").isdigit():
        shm_allreduce_buffer(int(env["RANK"]), env).unlink(missing_ok=True)

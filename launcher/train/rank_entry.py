"""Per-rank entry of pretraining, started by DeepSpeed's launcher (`roformer pretrain` builds the command):

    python -m launcher.train.rank_entry --config CFG --run-dir RUN_DIR [--set section.key=value ...]

Checks the input before the engine exists and before RUN_DIR is written (launcher/train/rank.py), agrees
on the resume (launcher/checkpoint/resume.py), then trains to the end. Exit codes: 0 finished, 2 bad
input, 143 stopped after saving a checkpoint (a SIGTERM / SIGINT at any moment, start-up included:
launcher/train/stop_signals.py), 1 a peer gone (docs/training.md, "Exit codes of every command"). Every
exit flushes the output, destroys the process group and skips the interpreter's finalization
(launcher/train/teardown.py); a console that goes away ends nothing (launcher/common/io.py keep_console).
"""
from __future__ import annotations

import os
import time

from launcher.common.cores import usable_cores
from launcher.common.defaults import BAD_INPUT_EXIT_CODE, RANK_ERROR_PREFIX
from launcher.common.errors import user_errors
from launcher.common.io import keep_console, write_line
from launcher.deepspeed_env.lean_imports import import_deepspeed
from launcher.deepspeed_env.ops_cache import ENV_VAR, extensions_dir, prepare_arch_list
from launcher.launch.env_forwarding import RANKS_PER_NODE_VAR, append_venv_bin
from launcher.run_dir.data_lease import leased_data
from launcher.run_dir.lock import held_run_dir
from launcher.train.peer_errors import rank_stop_line
from launcher.train.stop_signals import THIS_RANK
from launcher.train.teardown import end_rank

PROCESS_START = time.time()  # for the start-up timing event


def prepare_process_environment(environ: dict[str, str] = os.environ) -> None:
    """What must be set before torch and DeepSpeed are imported; only here, never at import time.

    Computed on the rank's own node from its own software and hardware, never forwarded from the
    launching machine (launcher/launch/env_forwarding.py): OMP_NUM_THREADS (unless forwarded): ranks
    of one node share its cores; without it every rank would start one thread per core and the node
    would be oversubscribed. TORCH_EXTENSIONS_DIR: this Python environment's op cache, keyed by this
    node's torch (a CPU torch on the login node and a CUDA torch here must not share one:
    launcher/deepspeed_env/ops_cache.py). PATH: the node's own, with the venv's bin appended (its tools, e.g. ninja)."""
    if "OMP_NUM_THREADS" not in environ:
        cores = usable_cores()
        # DeepSpeed's launcher sets LOCAL_SIZE; under mpirun / srun the plan's ranks per node stand in.
        local_ranks = next((environ[k] for k in ("LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                                                  RANKS_PER_NODE_VAR) if environ.get(k, "").isdigit()), "1")
        environ["OMP_NUM_THREADS"] = str(max(1, cores // max(1, int(local_ranks))))
    environ[ENV_VAR] = str(extensions_dir(environ))
    prepare_arch_list(environ)
    environ["PATH"] = append_venv_bin(environ.get("PATH", os.defpath))


def main(argv: list[str] | None = None) -> int:
    """The rank: its environment, its inputs checked, then, holding the run directory, the resume agreed,
    the components built and training run (launcher/train/rank.py)."""
    THIS_RANK.install()  # first: a stop during start-up is honoured at the first step boundary
    prepare_process_environment()

    keep_console()  # before DeepSpeed's logger takes sys.stdout: a console gone ends nothing (launcher/common/io.py)

    import_deepspeed()
    from launcher.train import rank  # torch and DeepSpeed: after the environment above

    timer = rank.PhaseTimer(PROCESS_START)
    try:
        inputs = rank.check_inputs(argv)
        keep_console(inputs.run_dir.rank_log(inputs.rank))  # where its lines go if its console goes away
        # Created when new; rank 0: its lock, and the lease on the data it reads (launcher/run_dir/data_lease.py).
        with held_run_dir(inputs.run_dir.root, inputs.rank), leased_data(inputs.cfg.data, inputs.run_dir.root,
                                                                         inputs.rank):
            started = rank.start(inputs, timer)
            return rank.run(started) if started is not None else 0
    except user_errors() as err:
        write_line(RANK_ERROR_PREFIX.format(rank=os.environ.get("RANK", "?")) + str(err))
        return BAD_INPUT_EXIT_CODE
    except (RuntimeError, KeyboardInterrupt) as err:
        stop = rank_stop_line(err, os.environ.get("RANK", "?"))
        if stop is None:
            raise
        write_line(stop[0])
        return stop[1]
    finally:
        end_rank()  # the process group before the interpreter ends: else a gloo worker can abort it (teardown.py)


if __name__ == "__main__":
    from launcher.train.teardown import exit_rank_process

    exit_rank_process(main)

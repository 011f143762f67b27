"""TEST-ONLY: many 2-rank exits on the rank's own error, cheaply (tests/multirank/test_rank_teardown.py).

    python -m tests.support.teardown_ranks SCENARIO[,SCENARIO...] WORK_DIR    (one repetition per SCENARIO)

What one repetition is: two ranks, each the real rank entry (launcher.train.rank_entry.main: its error
line, its teardown, then its exit: teardown.exit_rank_process) around a `start` that only does what
ends such a rank: the real rendezvous (process_group.init_distributed: DeepSpeed's gloo process group) and
then, by SCENARIO,
  save   the end of a save that failed on a full disk: rank 1's write fails with ENOSPC, all ranks
         agree on it (Checkpointer._agree: all_gather_object), rank 0 removes the partial checkpoint,
         and every rank raises CheckpointWriteError (Checkpointer._abandon), as in
         tests/multirank/test_checkpoint_disk_full.py;
  input  a refused input once the process group exists: rank 0's decision shared as resume.share does
         (broadcast_object_list), then a UserError on every rank;
  done   a rank that ends well after an all_gather_object, its process group still referenced (as
         DeepSpeed's engine and deepspeed.utils.groups keep theirs).
The process group's threads run at idle priority on their rank's core (gloo_threads_behind), which
makes the race of issue 33 frequent. The expensive part of a rank start, importing torch and DeepSpeed and loading DeepSpeed's CPU
all-reduce op, is done once: this process does it, then forks the two ranks of every repetition, all
at once (no thread of ours is running at a fork). The ranks write to this process's stdout/stderr (one
pipe, as under DeepSpeed's launcher); once all ended, this process prints the rank guard's exit line
for each that failed (launcher.launch.rank_process.exit_line) and `[teardown-test] {"repetition": i,
"exit": {rank: code}}` per repetition (a signal death as -N).
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import sys
from pathlib import Path

from launcher.train.rank_entry import prepare_process_environment
from tests.support.helpers import free_port

STILL_REFERENCED = []
REFUSED = "the refused input of this test, after the process group exists"
TAG = "global_step1"


def checked_inputs(argv: list[str]):
    """rank.check_inputs' stand-in: the run directory and rank of `--run-dir DIR`, and a run config whose only
    part read before `start` is the data section (rank 0 leases its data: DIR/data stands in for it)."""
    from types import SimpleNamespace

    from launcher.config.sections import DataSection
    from launcher.run_dir.layout import RunDir

    run_dir = Path(argv[argv.index("--run-dir") + 1])
    (run_dir / "data").mkdir(exist_ok=True)
    return SimpleNamespace(run_dir=RunDir(run_dir), rank=int(os.environ["RANK"]),
                           cfg=SimpleNamespace(data=DataSection(data_dir=str(run_dir / "data"))))


def failing_start(scenarios: list[str]):
    def start(inputs, timer):
        import deepspeed.comm as dist
        import torch.distributed

        from launcher.common.errors import UserError
        from launcher.checkpoint.checkpointer import write_failure
        from launcher.deepspeed_env.process_group import init_distributed
        from launcher.checkpoint.checkpointer import CheckpointedRun, Checkpointer
        from launcher.config.run_shape import RunShape

        rank = int(os.environ["RANK"])
        with gloo_threads_behind(rank):
            init_distributed()
        world_size = dist.get_world_size()
        scenario = scenarios[int(inputs.run_dir.root.name.removeprefix("run"))]
        if scenario == "done":  # a rank that ends well while its process group is still referenced, as the
            # engine and deepspeed.utils.groups keep theirs: destroy_process_group then leaves its threads alive
            STILL_REFERENCED.append(torch.distributed.group.WORLD)
            box = [None] * world_size
            dist.all_gather_object(box, rank)  # the last collective: its work holds Python-owned tensors
            return None
        if scenario == "input":  # as resume.share, then a refusal: the broadcast's work holds Python-owned tensors
            box = [REFUSED if rank == 0 else None]
            dist.broadcast_object_list(box, src=0)
            raise UserError(box[0])
        run_dir = inputs.run_dir
        directory = run_dir.checkpoint(TAG)
        run = CheckpointedRun(run_dir, rank, RunShape(zero_stage=2, precision="fp32", world_size=world_size),
                              model_config=None, total_steps=1, keep_last=1)
        checkpointer = Checkpointer(run, None, None, None)
        mine = None
        if rank == 1:
            full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory / "mp_rank_01_model_states.pt"))
            mine = write_failure(rank, full, directory)
        checkpointer._abandon(directory, TAG, checkpointer._agree(mine))  # raises CheckpointWriteError

    return start


@contextlib.contextmanager
def gloo_threads_behind(rank: int):
    """The threads the block starts (the process group's: gloo's workers and its transport loop) run at
    idle priority on the core of this rank's main thread: a worker that finished a collective runs again
    only when the main thread waits, as a worker on a busy machine may. Without the teardown that made
    about one rank exit in two abort (the issue's rate); with it, none."""
    core = {sorted(os.sched_getaffinity(0))[rank % len(os.sched_getaffinity(0))]}
    os.sched_setaffinity(0, core)  # this thread; the threads it starts inherit it
    before = set(os.listdir("/proc/self/task"))
    yield
    for tid in set(os.listdir("/proc/self/task")) - before:
        os.sched_setscheduler(int(tid), os.SCHED_IDLE, os.sched_param(0))


def main(argv: list[str]) -> int:
    scenarios, work = argv[0].split(","), Path(argv[1])
    prepare_process_environment()
    from launcher.checkpoint.catalogue import write_save_record
    from launcher.common.io import write_line
    from launcher.launch.rank_process import _rank_identity, exit_line
    from launcher.train import rank as rank_module
    from launcher.train import rank_entry
    from launcher.train.teardown import exit_rank_process

    rank_module.check_inputs, rank_module.start = checked_inputs, failing_start(scenarios)
    # All repetitions at once: ranks competing for the cores is when a gloo worker thread falls behind its
    # rank's main thread (the race this test is about).
    children, envs = {}, {}
    for repetition in range(len(scenarios)):
        run_dir = work / f"run{repetition}"
        (run_dir / "checkpoints" / TAG).mkdir(parents=True)
        # A save cut short as a real one is: its save record first, then part of DeepSpeed's files.
        write_save_record(run_dir / "checkpoints" / TAG, TAG)
        (run_dir / "checkpoints" / TAG / "mp_rank_00_model_states.pt").write_bytes(b"partial")
        (run_dir / "checkpoints" / "latest").write_text("global_step0")
        env = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        sys.stdout.flush()
        sys.stderr.flush()
        for rank in (0, 1):
            pid = os.fork()
            if pid == 0:  # the rank: it ends as the real one does (rank_entry's __main__)
                os.environ.update(env, RANK=str(rank), LOCAL_RANK=str(rank))
                exit_rank_process(lambda: rank_entry.main(["--config", os.devnull, "--run-dir", str(run_dir)]))
            children[(repetition, rank)] = pid
            envs[(repetition, rank)] = {**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}
    codes: dict[int, dict[int, int]] = {}
    for (repetition, rank), pid in children.items():
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        codes.setdefault(repetition, {})[rank] = code
        if code != 0:
            write_line(exit_line(_rank_identity(envs[(repetition, rank)]), pid, code))  # one write: ranks still run
    for repetition, exits in sorted(codes.items()):
        print("[teardown-test] " + json.dumps({"repetition": repetition, "exit": exits}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

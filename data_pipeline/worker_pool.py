"""The worker processes of `roformer data prepare` (data_pipeline/prepare.py): both passes share one pool.

Spawned, not forked (pyarrow / datasets threads in the parent must not be inherited half-locked); each
worker adds the bytes it reads to one shared counter for the progress lines (data_pipeline/progress.py);
Ctrl-C stops the pool from the parent, never as a traceback from a worker.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal

from data_pipeline.progress import install_counter


def worker_init(counter) -> None:
    # Workers only read text and run SentencePiece; without this `datasets` imports torch (~3 s).
    os.environ["USE_TORCH"] = "0"
    install_counter(counter)  # the progress lines' shared byte count
    # Ctrl-C reaches the whole foreground process group, workers included. Stopping the pool is the
    # parent's job (KeyboardInterrupt there -> pool.terminate()); a worker's own KeyboardInterrupt would
    # only print a traceback, and the pool would start a replacement. SIGINT arrived blocked (worker_pool):
    # ignoring it before unblocking drops one that came while this worker was starting.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def progress_counter():
    """The byte count every worker adds to (data_pipeline/progress.py)."""
    return multiprocessing.get_context("spawn").Value("q", 0)


class InlinePool:
    """`workers=1`: run tasks in this process (no start-up cost, easier debugging)."""

    def imap(self, fn, tasks):
        return map(fn, tasks)


@contextlib.contextmanager
def worker_pool(workers: int, counter):
    """`workers` spawned processes for both passes of `data prepare` (in-process for 1), stopped with it."""
    if workers == 1:
        install_counter(counter)
        try:
            yield InlinePool()
        finally:
            install_counter(None)
        return
    # spawn, not fork: pyarrow/datasets threads in the parent must not be inherited half-locked.
    # Each worker pays the `datasets` start-up (~3-5 s) once, for both passes.
    # SIGINT is blocked while the workers are spawned: each inherits the blocked mask, so a Ctrl-C during
    # its seconds of start-up (before worker_init ignores SIGINT) cannot kill it with a traceback; in
    # this process a SIGINT that came meanwhile is taken once the mask is restored, inside the `try`,
    # where `pool` exists and is terminated.
    pool = None
    try:
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            pool = multiprocessing.get_context("spawn").Pool(workers, initializer=worker_init, initargs=(counter,))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        yield pool
        pool.close()
    except BaseException:
        if pool is not None:
            pool.terminate()
        raise
    finally:
        if pool is not None:
            pool.join()

"""RUN_DIR/plots/ kept current by the training run itself, without ever slowing or failing it.

Rank 0 calls PlotHook.stage_end() after each stage-end checkpoint and run_end() when the run ends; each
starts `python -m launcher report RUN_DIR --plots-only` at lowered priority and returns at once, and
renders take turns (render_lock). A render that must outlive the rank is detached through a short-lived
intermediate process: DeepSpeed's launcher kills every rank's process tree when one rank exits non-zero,
as an orderly stop (143) does. Only the normal end waits, at most RUN_END_WAIT_S. A failure is logged,
never raised. Imports nothing from launcher.train (which imports it).
"""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from launcher.run_dir.layout import RENDER_LOCK, RunDir

RUN_END_WAIT_S = 120.0
LOG_NAME = "render.log"
# Starts the render in its own session and exits: the render is re-parented to init at once.
DETACH = "import subprocess, sys; subprocess.Popen(sys.argv[1:], start_new_session=True, stdin=subprocess.DEVNULL)"


@contextmanager
def render_lock(plots_dir: Path, wait: bool = True) -> Iterator[bool]:
    """Hold plots_dir's render lock for the block; with wait=False, yields False at once when
    another render holds it."""
    plots_dir.mkdir(parents=True, exist_ok=True)
    with open(plots_dir / RENDER_LOCK, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class PlotHook:
    """A stage end while a render is still going skips its own (the next one, or the run end, covers
    its data). The last stage's end is left to run_end, which sees the run's end record."""

    def __init__(self, run_dir: RunDir, total_steps: int, message: Callable[[str], None]):
        self.run_dir, self.total_steps, self.message = run_dir, total_steps, message

    def stage_end(self, step: int) -> None:
        if step >= self.total_steps or self._busy():
            return
        self._start(step, detached=True)

    def run_end(self, step: int, wait: bool) -> None:
        """Render the final state; with `wait`, wait for it (after any render still going, which
        holds the lock), RUN_END_WAIT_S at most."""
        proc = self._start(step, detached=not wait)
        if proc is None or not wait:
            return
        try:
            code = proc.wait(timeout=RUN_END_WAIT_S)
        except subprocess.TimeoutExpired:
            self.message(f"plots: still rendering after {RUN_END_WAIT_S:.0f} s; they will appear in "
                         f"{self.run_dir.plots} (log: {self._log_path()})")
            return
        if code != 0:
            self.message(f"plots: rendering failed (exit code {code}); see {self._log_path()}")

    def _start(self, step: int, detached: bool) -> subprocess.Popen | None:
        """The render process (the intermediate one, already ended, when detached); None if it could not start."""
        try:
            self.run_dir.plots.mkdir(parents=True, exist_ok=True)
            nice = shutil.which("nice")
            cmd = [*([nice, "-n", "10"] if nice else []), sys.executable, "-m", "launcher", "report",
                   str(self.run_dir.root), "--plots-only"]
            if detached:
                cmd = [sys.executable, "-S", "-c", DETACH, *cmd]  # -S: no site packages, starts in ms
            env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
            with open(self._log_path(), "ab") as log:
                log.write(f"--- step {step}: render started {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
                log.flush()
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True, close_fds=True, env=env)
            if detached:
                proc.wait(timeout=60)  # the intermediate: gone as soon as the render has started
            return proc
        except Exception as err:  # plots are a convenience: never let them stop training
            self.message(f"plots: could not start rendering ({type(err).__name__}: {err}); training goes on")
            return None

    def _busy(self) -> bool:
        try:
            with render_lock(self.run_dir.plots, wait=False) as free:
                return not free
        except OSError:
            return False  # _start reports what is wrong with the directory

    def _log_path(self) -> Path:
        return self.run_dir.plots / LOG_NAME

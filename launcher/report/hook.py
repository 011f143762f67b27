"""RUN_DIR/plots/ kept current by the training run itself, without ever slowing or failing it.

Rank 0 calls PlotHook.stage_end() after each stage-end checkpoint and PlotHook.run_end() when the
run finishes or stops. Each starts `python -m launcher report RUN_DIR --plots-only` as a detached
process (own session, lowered priority, one thread; output to RUN_DIR/plots/render.log) and
returns at once: training never waits for matplotlib. Only at the normal end of a run does rank 0
wait, at most RUN_END_WAIT_S, so the plots are complete when `roformer pretrain` returns; a render
still going then finishes on its own. Any failure is logged as one message and training goes on.

Imports nothing from launcher.train and nothing heavy (launcher.train imports it).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from typing import Callable

from launcher.run_dir import RunDir

RUN_END_WAIT_S = 120.0
LOG_NAME = "render.log"


class PlotHook:
    """At most one stage-end render at a time (a stage shorter than a render skips its own; the next
    one, or the run end, covers its data). The last stage's end is left to run_end, which sees the
    run's end record."""

    def __init__(self, run_dir: RunDir, total_steps: int, message: Callable[[str], None]):
        self.run_dir, self.total_steps, self.message = run_dir, total_steps, message
        self.proc: subprocess.Popen | None = None

    def stage_end(self, step: int) -> None:
        if step >= self.total_steps or self._running():
            return
        self._start(step)

    def run_end(self, step: int, wait: bool) -> None:
        """Render the final state; with `wait`, after the render still running (so the newest data
        is written last), and wait for it too, RUN_END_WAIT_S in all."""
        deadline = time.monotonic() + RUN_END_WAIT_S
        if wait and self._running():
            try:
                self.proc.wait(timeout=RUN_END_WAIT_S)
            except subprocess.TimeoutExpired:
                pass
        self._start(step)
        if not wait or self.proc is None:
            return
        try:
            code = self.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.message(f"plots: still rendering after {RUN_END_WAIT_S:.0f} s; they will appear in "
                         f"{self.run_dir.plots} (log: {self._log_path()})")
            return
        if code != 0:
            self.message(f"plots: rendering failed (exit code {code}); see {self._log_path()}")

    def _start(self, step: int) -> None:
        try:
            self.run_dir.plots.mkdir(parents=True, exist_ok=True)
            nice = shutil.which("nice")
            cmd = [*([nice, "-n", "10"] if nice else []), sys.executable, "-m", "launcher", "report",
                   str(self.run_dir.root), "--plots-only"]
            env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
            with open(self._log_path(), "ab") as log:
                log.write(f"--- step {step}, {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
                log.flush()
                # Own session: a Ctrl-C to the training job's process group does not cut a render short.
                self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                             start_new_session=True, close_fds=True, env=env)
        except Exception as err:  # plots are a convenience: never let them stop training
            self.proc = None
            self.message(f"plots: could not start rendering ({type(err).__name__}: {err}); training goes on")

    def _running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _log_path(self):
        return self.run_dir.plots / LOG_NAME

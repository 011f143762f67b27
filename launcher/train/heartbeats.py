"""A rank's side of the hang watchdog: its heartbeats, each with a bound from the step times seen so far.

    progress = HeartbeatWriter(run_dir, rank, cfg.watchdog)
    progress.start_up("engine")                 # bound: watchdog.startup_seconds
    with progress.step(step, stage.index): ...  # bound from this stage's step times
    progress.ended("finished", step)            # no longer watched

Each call replaces RUN_DIR/heartbeats/rank<r>.json before the work starts; the rank's wrapper
(launcher.launch.watchdog) compares it with the time since it was written.
"""
from __future__ import annotations

import os
import time
from collections import deque
from contextlib import contextmanager
from typing import Callable, Iterator

from launcher.config.watchdog_section import WatchdogSection
from launcher.run_dir.heartbeat_file import Heartbeat, write_record
from launcher.run_dir.layout import RunDir


class PhaseBounds:
    """How long the next step or phase may take, from the watchdog config and the times observed so far.

    A training step: watchdog.phase_seconds during a stage's first `warmup_steps` steps (new shapes,
    first-use kernels; also after a resume) and until one later step has been timed; then
    max(min_step_seconds, step_factor x the slowest of the stage's last `history_steps` timed steps).
    Any other phase kind: max(phase_seconds, step_factor x the longest run of that kind so far).
    """

    def __init__(self, cfg: WatchdogSection):
        self.cfg = cfg
        self.stage: int | None = None
        self.steps_in_stage = 0
        self.step_times: deque[float] = deque(maxlen=cfg.history_steps)
        self.longest: dict[str, float] = {}

    def step_bound(self, stage: int) -> float:
        if stage != self.stage:
            self.stage, self.steps_in_stage = stage, 0
            self.step_times.clear()
        if not self.step_times:
            return self.cfg.phase_seconds
        return max(self.cfg.min_step_seconds, self.cfg.step_factor * max(self.step_times))

    def record_step(self, seconds: float) -> None:
        """A step of the current stage finished after `seconds` (call after step_bound)."""
        self.steps_in_stage += 1
        if self.steps_in_stage > self.cfg.warmup_steps:
            self.step_times.append(seconds)

    def phase_bound(self, kind: str) -> float:
        return max(self.cfg.phase_seconds, self.cfg.step_factor * self.longest.get(kind, 0.0))

    def record_phase(self, kind: str, seconds: float) -> None:
        self.longest[kind] = max(seconds, self.longest.get(kind, 0.0))

    def startup_bound(self) -> float:
        return self.cfg.startup_seconds


class HeartbeatWriter:
    """Writes this rank's heartbeat at every step and phase start (nothing when the watchdog is off)."""

    def __init__(self, run_dir: RunDir | None, rank: int, cfg: WatchdogSection,
                 clock: Callable[[], float] = time.monotonic):
        self.enabled = cfg.enabled and run_dir is not None
        self.path = run_dir.heartbeat(rank) if self.enabled else None
        self.rank, self.clock = rank, clock
        self.bounds = PhaseBounds(cfg)
        self.seq = 0
        if self.enabled:
            run_dir.heartbeats.mkdir(parents=True, exist_ok=True)

    @classmethod
    def disabled(cls) -> "HeartbeatWriter":
        """Records nothing (a trainer built without a watchdog, e.g. in a test)."""
        return cls(None, 0, WatchdogSection(enabled=False))

    def start_up(self, what: str) -> None:
        self._beat(f"start-up: {what}", None, self.bounds.startup_bound())

    @contextmanager
    def step(self, step: int, stage: int) -> Iterator[None]:
        self._beat("train", step, self.bounds.step_bound(stage))
        start = self.clock()
        yield
        self.bounds.record_step(self.clock() - start)

    @contextmanager
    def phase(self, kind: str, step: int) -> Iterator[None]:
        self._beat(kind, step, self.bounds.phase_bound(kind))
        start = self.clock()
        yield
        self.bounds.record_phase(kind, self.clock() - start)

    def ended(self, outcome: str, step: int) -> None:
        self._beat(outcome, step, None)

    def _beat(self, phase: str, step: int | None, bound: float | None) -> None:
        if not self.enabled:
            return
        self.seq += 1
        write_record(self.path, Heartbeat(rank=self.rank, pid=os.getpid(), phase=phase, step=step,
                                          bound_seconds=bound, monotonic=self.clock(), wall_time=time.time(),
                                          seq=self.seq))

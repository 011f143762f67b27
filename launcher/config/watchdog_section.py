"""The `watchdog:` section of a run config: how long a rank may go without progress before the job is
stopped as hung (launcher.train.heartbeats computes the bounds, launcher.launch.watchdog enforces them).

    watchdog:
      enabled: true
      step_factor: 5.0          # a step may take 5x the slowest recent step of its stage ...
      min_step_seconds: 120.0   # ... but never less than this
      phase_seconds: 900.0      # validation, checkpoint save, stage switch, a stage's first steps
      startup_seconds: 1800.0   # each start-up phase (resume checks, rendezvous, engine, checkpoint load)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass
class WatchdogSection:
    enabled: bool = True
    """Each rank records its progress in RUN_DIR/heartbeats/ and its rank guard stops the job when a rank
    exceeds its bound (exit code 124, the rank and node named). false = no heartbeats, no watchdog."""
    step_factor: float = 5.0
    """A training step may take this many times the slowest of the last `history_steps` steps of its stage."""
    min_step_seconds: float = 120.0
    """Floor of the derived step bound: jitter of fast steps (a busy shared filesystem, a slow
    TensorBoard flush on rank 0) never trips the watchdog."""
    warmup_steps: int = 3
    """The first steps of every stage and of a resumed run (new shapes: allocator growth, first-use
    kernels) are bounded by phase_seconds and left out of the step history; the derived step bound
    applies once a later step has been timed."""
    history_steps: int = 20
    """How many recent step times of the stage the step bound looks at."""
    phase_seconds: float = 900.0
    """Bound of a validation, checkpoint save, stage switch and stage end, and of a stage's first steps.
    Once a kind of phase has been timed, its bound is the larger of this and step_factor x its longest run."""
    startup_seconds: float = 1800.0
    """Bound of each start-up phase: rank 0's resume checks, rendezvous (init_distributed), run files and
    universal conversion, engine build (first-use op compilation) and checkpoint load. A rank's input checks
    (config, data) write nothing, not even a heartbeat: its peers' rendezvous bound covers them."""

    def check(self, fail: Callable[[str, str], None]) -> None:
        """fail(field, message) for the first bad value (fields named as watchdog.<field>)."""
        for name in ("step_factor", "min_step_seconds", "phase_seconds", "startup_seconds"):
            if not getattr(self, name) > 0:
                fail(f"watchdog.{name}", f"must be > 0, got {getattr(self, name)}")
        if self.step_factor < 1:
            fail("watchdog.step_factor", f"must be >= 1 (a bound below the observed step time), got {self.step_factor}")
        for name in ("warmup_steps", "history_steps"):
            if getattr(self, name) < 1:
                fail(f"watchdog.{name}", f"must be >= 1, got {getattr(self, name)}")

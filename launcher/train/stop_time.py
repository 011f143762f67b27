"""How long a requested stop takes here, against the shortest time a stop may be given.

A stop (SIGTERM / Ctrl-C) finishes the step in flight, at most one more, and checkpoints it. A rank not
done by then is ended by DeepSpeed's per-node launcher DEEPSPEED_LAUNCHER_GRACE_SECONDS after it passed
a SIGTERM on, or after restarts.preemption_grace_seconds. Rank 0 measures both parts (its slowest recent
steps, its last save) and says once, in one line, when a stop no longer fits the shorter limit
(docs/multinode.md, "Grace time").
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Iterable

DEEPSPEED_LAUNCHER_GRACE_SECONDS = 30.0
"""psutil.wait_procs(children, timeout=30) in DeepSpeed's launch.py (tests/unit/test_console_gone.py reads it)."""
RECENT_STEPS = 20


class StopTime:
    """Fed with the run's step times and checkpoint saves; `say` gets the one line (at most once)."""

    def __init__(self, preemption_grace: float, say: Callable[[str], None], history: Iterable[dict] = ()):
        """history: metrics.jsonl's records before this start (its last steps and checkpoint count)."""
        self.preemption_grace, self.say = preemption_grace, say
        self.steps: deque[float] = deque(maxlen=RECENT_STEPS)
        self.save_seconds: float | None = None
        self.said = False
        for record in history:
            if record.get("kind") == "train" and record.get("step_time_s") is not None:
                self.steps.append(float(record["step_time_s"]))
            elif record.get("event") == "checkpoint" and record.get("seconds") is not None:
                self.save_seconds = float(record["seconds"])
        if self.save_seconds is not None:
            self.check()

    def step(self, seconds: float) -> None:
        self.steps.append(seconds)

    def checkpoint(self, seconds: float) -> None:
        self.save_seconds = seconds
        self.check()

    def estimate(self) -> float | None:
        """Seconds from a stop request to its checkpoint on disk: two of the slowest recent steps and the
        last save (None before the first save)."""
        if self.save_seconds is None:
            return None
        return 2 * max(self.steps, default=0.0) + self.save_seconds

    def check(self) -> None:
        seconds = self.estimate()
        if self.said or seconds is None:
            return
        limit = min(DEEPSPEED_LAUNCHER_GRACE_SECONDS, self.preemption_grace)
        if seconds <= limit:
            return
        self.said = True
        parts = (f"a stop here takes about {seconds:.0f} s (up to 2 steps of {max(self.steps, default=0.0):.1f} s "
                 f"and a checkpoint save of {self.save_seconds:.1f} s)")
        if seconds > self.preemption_grace:
            self.say(f"pretrain: note: {parts}, more than restarts.preemption_grace_seconds ({self.preemption_grace:g} s):"
                     f" a SIGTERM / Ctrl-C ends the ranks without their stop checkpoint; raise it")
        else:
            self.say(f"pretrain: note: {parts}, more than the {DEEPSPEED_LAUNCHER_GRACE_SECONDS:g} s DeepSpeed's "
                     f"per-node launcher gives its ranks after a SIGTERM to it (the plain `deepspeed` route, a "
                     f"scheduler signalling every process): such a stop loses the steps since the previous "
                     f"checkpoint; stop through `roformer pretrain` or signal the ranks alone "
                     f"({self.preemption_grace:g} s: restarts.preemption_grace_seconds)")

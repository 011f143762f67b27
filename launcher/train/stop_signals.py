"""SIGTERM / SIGINT / SIGHUP on a rank, from its first instant to its last step (docs/training.md, "Stopping a run").

A stop asked at any moment ends the run at the first step boundary after it, with a checkpoint: the rank
entry installs the handlers first thing (launcher/train/rank_entry.py: before torch and DeepSpeed are
imported), they only record the request, and the trainer reads it at its next step (all ranks agree
through the step's all-reduce: finish the step, checkpoint, exit). The rank's wrapper starts it with both
signals blocked (launcher/launch/rank_process.py), so one that arrives before the handlers is held, not
lost, and delivered to them when `install` unblocks it. Only the standard library here: this module is
imported before the environment torch needs is set.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Callable

from launcher.common.defaults import RANK_STOP_SIGNALS, stop_signals_to_handle
from launcher.common.io import write_line

SAME_STOP_SECONDS = 5.0
"""A second stop signal this soon after the first is the same stop delivered twice (a scheduler preempting
the job signals every process of it, and DeepSpeed's per-node launcher passes its own on to the ranks),
not a second request: it is ignored, so the checkpoint at the current step is still written."""


@dataclass(frozen=True)
class StopRequested:
    signal: str
    """SIGTERM, SIGINT or SIGHUP."""
    at: float
    """time.monotonic() when it arrived."""


@dataclass(frozen=True)
class StopAnnouncer:
    """What the stop says and how long it may take, known once the rank's trainer exists."""

    grace: float
    """restarts.preemption_grace_seconds: counted from the request's arrival, start-up included."""
    rank: int
    say: Callable[[str], None]
    """The console line (rank 0's metrics.message)."""
    next_step: Callable[[], int]
    """The step being trained (for the console line)."""
    last_step: int | None = None
    """The schedule's last step: a stop that arrives once it is trained says the run is finishing, not
    'finishing step 31' of a 30-step run (issue 63, item 6)."""


class StopSignals:
    """The rank's stop requests: `requested` (None until one arrives) is what the trainer reads at every step.
    Past restarts.preemption_grace_seconds without the checkpoint the rank exits, saying so."""

    def __init__(self):
        self.requested: StopRequested | None = None
        self.announcer: StopAnnouncer | None = None
        self.grace_timer: threading.Timer | None = None
        """Runs out the grace time once a request was announced."""

    def install(self) -> None:
        """Record SIGTERM, SIGINT and SIGHUP (unless ignored under nohup) from now on (then deliver one held
        by the wrapper's signal mask)."""
        for signum in stop_signals_to_handle():
            signal.signal(signum, self._on_signal)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, RANK_STOP_SIGNALS)

    def arm(self, announcer: StopAnnouncer) -> None:
        """The trainer is ready: a request from now on, or one recorded during start-up, is announced and
        the grace time runs (what is left of it for a request that arrived during start-up)."""
        self.announcer = announcer
        if signal.getsignal(signal.SIGTERM) != self._on_signal:  # started without the rank entry (a benchmark)
            self.install()
        if self.requested is not None:
            self._announce()

    def _on_signal(self, signum, _frame) -> None:
        if self.requested is None:
            self.requested = StopRequested(signal.Signals(signum).name, time.monotonic())
            if self.announcer is not None:
                self._announce()
        elif time.monotonic() - self.requested.at < SAME_STOP_SECONDS:
            pass  # the same stop, fanned out by the process tree
        else:  # a second signal: stop now
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def _announce(self) -> None:
        announcer, requested = self.announcer, self.requested
        step = announcer.next_step()
        if announcer.last_step is not None and step > announcer.last_step:
            announcer.say(f"stop requested ({requested.signal}) after the last step ({announcer.last_step}): the "
                          f"run is finishing")
        else:
            announcer.say(f"stop requested ({requested.signal}): finishing step {step}, then a checkpoint "
                          f"(within {announcer.grace:g} s)")
        left = max(0.0, announcer.grace - (time.monotonic() - requested.at))
        self.grace_timer = threading.Timer(left, self._out_of_grace)
        self.grace_timer.daemon = True  # a rank that finished its checkpoint exits without waiting for it
        self.grace_timer.start()

    def _out_of_grace(self) -> None:
        write_line(f"pretrain (rank {self.announcer.rank}): no checkpoint within the preemption grace time of "
                   f"{self.announcer.grace:g} s (restarts.preemption_grace_seconds): exiting without it; the newest "
                   f"complete checkpoint stays the resume point")
        os._exit(1)


THIS_RANK = StopSignals()
"""This process's: signal handlers belong to the process, so one instance, installed by the rank entry."""

"""SIGTERM / SIGINT on a rank: a `StopRequested` the trainer reads at its next step and acts on (all ranks
agree through the step's all-reduce: finish the step, checkpoint, exit), within
restarts.preemption_grace_seconds; after that the rank exits without the checkpoint, saying so."""
from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Callable

from launcher.io import write_line

SAME_STOP_SECONDS = 5.0
"""A second stop signal this soon after the first is the same stop delivered twice (a scheduler preempting
the job signals every process of it, and DeepSpeed's per-node launcher passes its own on to the ranks),
not a second request: it is ignored, so the checkpoint at the current step is still written."""


@dataclass(frozen=True)
class StopRequested:
    signal: str
    """SIGTERM or SIGINT."""
    at: float
    """time.monotonic() when it arrived."""


class StopSignals:
    """This rank's stop requests: `requested` is None until the first SIGTERM / SIGINT after `install`."""

    def __init__(self, grace_seconds: float, rank: int, say: Callable[[str], None]):
        """say: the console line (rank 0's metrics.message)."""
        self.grace, self.rank, self.say = grace_seconds, rank, say
        self.requested: StopRequested | None = None

    def install(self, next_step: Callable[[], int]) -> None:
        """Handle SIGTERM and SIGINT from now on; next_step: the step being trained (for the console line)."""
        def request_stop(signum, _frame):
            if self.requested is None:
                self.requested = StopRequested(signal.Signals(signum).name, time.monotonic())
                self.say(f"stop requested ({self.requested.signal}): finishing step {next_step()}, then a checkpoint "
                         f"(within {self.grace:g} s)")
                timer = threading.Timer(self.grace, self._out_of_grace)
                timer.daemon = True  # a rank that finished its checkpoint exits without waiting for it
                timer.start()
            elif time.monotonic() - self.requested.at < SAME_STOP_SECONDS:
                pass  # the same stop, fanned out by the process tree
            else:  # a second signal: stop now
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)

        signal.signal(signal.SIGTERM, request_stop)
        signal.signal(signal.SIGINT, request_stop)

    def _out_of_grace(self) -> None:
        write_line(f"pretrain (rank {self.rank}): no checkpoint within the preemption grace time of {self.grace:g} s "
                   f"(restarts.preemption_grace_seconds): exiting without it; the newest complete checkpoint stays the "
                   f"resume point")
        os._exit(1)

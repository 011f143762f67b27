"""The `restarts:` section of a run config: what `roformer pretrain` does on its own after a fault
(launcher.launch.restart_loop; the fields and their defaults: docs/unattended.md).

`--max-restarts N` and `--exclude-failed-nodes` override max_restarts and exclude_failed_nodes. Only the
launching machine reads this section, so changing it between runs is not a new config version of the run.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass
class RestartsSection:
    max_restarts: int = 0
    """Restarts of the job after a rank died, a node's launcher exited, the hang watchdog stopped the job
    or the ranks were preempted (SIGTERM not sent by `roformer pretrain`). 0 = none (stop and say how to
    resume). A restart resumes from the newest intact checkpoint (step 0 when there is none)."""
    backoff_seconds: float = 10.0
    """Wait before the first restart (a flapping link, a node rebooting); doubled for each further one."""
    max_backoff_seconds: float = 300.0
    """The longest wait between two restarts."""
    exclude_failed_nodes: bool = False
    """Restart without the node that failed or hung (the world shrinks; each stage keeps its global batch
    through more gradient accumulation, or the restart is refused naming the stage)."""
    preemption_grace_seconds: float = 120.0
    """On SIGTERM (a scheduler preempting the job) or Ctrl-C: how long the ranks get to finish their step
    and write a checkpoint at it before every process of the job is stopped."""

    def check(self, fail: Callable[[str, str], None]) -> None:
        """fail(field, message) for the first bad value (fields named as restarts.<field>)."""
        if self.max_restarts < 0:
            fail("restarts.max_restarts", f"must be >= 0, got {self.max_restarts}")
        if self.backoff_seconds < 0:
            fail("restarts.backoff_seconds", f"must be >= 0, got {self.backoff_seconds}")
        if self.max_backoff_seconds < self.backoff_seconds:
            fail("restarts.max_backoff_seconds",
                 f"must be >= restarts.backoff_seconds ({self.backoff_seconds}), got {self.max_backoff_seconds}")
        if not self.preemption_grace_seconds > 0:
            fail("restarts.preemption_grace_seconds", f"must be > 0, got {self.preemption_grace_seconds}")

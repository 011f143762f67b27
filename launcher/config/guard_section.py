"""The `guard:` section of a run config: the numerics guard's rules and what it does when one fires.

launcher/train/numerics_guard.py detects, launcher/train/guard_actions.py acts. The action is off, warn,
stop or rewind (`roformer pretrain --guard ACTION`); every field, its default and the runs the defaults
come from: docs/unattended.md, "The numerics guard".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

GUARD_ACTIONS = ("off", "warn", "stop", "rewind")


@dataclass
class GuardSection:
    action: str = "rewind"
    """What a trigger does: 'warn' (an event and a console line, training goes on), 'stop' (the run ends in
    one line; no checkpoint is written from the flagged steps, so the resume point is from before the
    spike), 'rewind' (back to the newest intact checkpoint from before the spike, skip batches, go on) or
    'off' (no detection at all)."""
    window: int = 50
    """Steps whose median a step's loss and gradient norm are compared with (flagged steps are left out)."""
    min_window: int = 10
    """After optimizer warmup a spike rule judges once its window holds this many values (at most `window`),
    against the median of what it holds (a resumed run's window is rebuilt from its records)."""
    spike_factor: float = 1.5
    """A loss above spike_factor x the window's median flags the step."""
    grad_norm_factor: float = 5.0
    """A gradient norm above grad_norm_factor x the window's median flags the step (the same rule as the
    loss: the gradient norm is much noisier, so its factor is wider)."""
    patience: int = 3
    """A spike is this many flagged steps in a row (a single noisy step is no spike)."""
    stage_switch_factor: float = 1.5
    """For `window` steps after a stage switch (new length and batch: the loss moves) both spike factors
    are multiplied by this."""
    min_loss_scale_steps: int = 20
    """fp16: a loss scale at its configured minimum (fp16.min_loss_scale) for this many steps in a row."""
    max_skipped_share: float = 0.5
    """fp16: more than this share of the last `window` steps skipped (overflow) triggers."""
    skip_batches: int = 0
    """rewind: global batches of the data stream skipped right after the checkpoint rewound to; 0 = as
    many as steps were trained from that checkpoint through the trigger (every batch that led into the
    spike)."""
    max_rewinds: int = 3
    """rewind: more rewinds than this in one run (counted across restarts) end the run as `stop` does."""

    def check(self, fail: Callable[[str, str], None]) -> None:
        """fail(field, message) for the first bad value (fields named as guard.<field>)."""
        if self.action not in GUARD_ACTIONS:
            fail("guard.action", f"must be one of {', '.join(GUARD_ACTIONS)}, got {self.action!r}")
        for name in ("window", "min_window", "patience", "min_loss_scale_steps"):
            if getattr(self, name) < 1:
                fail(f"guard.{name}", f"must be >= 1, got {getattr(self, name)}")
        for name in ("spike_factor", "grad_norm_factor"):
            if not getattr(self, name) > 1:
                fail(f"guard.{name}", f"must be > 1 (a factor <= 1 flags ordinary steps), got {getattr(self, name)}")
        if not self.stage_switch_factor >= 1:
            fail("guard.stage_switch_factor", f"must be >= 1 (1 = no widening), got {self.stage_switch_factor}")
        if not 0 < self.max_skipped_share <= 1:
            fail("guard.max_skipped_share", f"must be in (0, 1], got {self.max_skipped_share}")
        for name in ("skip_batches", "max_rewinds"):
            if getattr(self, name) < 0:
                fail(f"guard.{name}", f"must be >= 0, got {getattr(self, name)}")

"""What the numerics guard decides about a trigger (launcher/train/numerics_guard.py detects): go on
(warn), `Stop`, or `Rewind` to the newest intact checkpoint from before the spike and skip the batches
that led into it. The trainer carries the decision out (launcher/train/trainer.py); nothing here touches
the engine, the data stream or the checkpoints' files.

Every rank runs the same code on the same all-reduced figures, so all reach the same verdict with no
extra collective; only a rewind, a restore and a rebuild exchange something (rank 0 reads, all adopt).
Every trigger and action is a `guard` event in metrics.jsonl (shown by `roformer report`, marked on the
loss plot) and TensorBoard scalars under guard/.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import deepspeed.comm as dist

from launcher.config.guard_section import GuardSection
from launcher.config.run_config import RunConfig
from launcher.config.run_shape import RunShape
from launcher.checkpoint.catalogue import CheckpointEntry, newest_complete_before, rewind_point
from launcher.deepspeed_env.engine_state import min_loss_scale
from launcher.run_dir.layout import RunDir
from launcher.train.guard_history import GUARD_EVENT, Rewound, read_history
from launcher.train.metrics import Metrics
from launcher.train.numerics_guard import NumericsGuard, StepFigures, Trigger
from launcher.train.heartbeats import HeartbeatWriter

__all__ = ["GUARD_EVENT", "GuardActions", "Rewind", "Rewound", "Stop"]


@dataclass(frozen=True)
class Rewind:
    """Load `point` (every rank), skip the next `skip_batches` global batches, then `GuardActions.rewound`."""

    point: CheckpointEntry
    skip_batches: int
    trigger: Trigger
    started: float
    """time.perf_counter() at the decision: the event's seconds include the reload."""


@dataclass(frozen=True)
class Stop:
    """End the run; `line` is what the rank prints last (after its error prefix)."""

    line: str


class GuardActions:
    """The trainer's numerics guard: `restore` once at start-up, `after_step` once per step on every rank."""

    def __init__(self, cfg: GuardSection, detector: NumericsGuard, run_dir: RunDir, metrics: Metrics, rank: int,
                 shape: RunShape, heartbeats: HeartbeatWriter | None = None):
        """shape: the running engine's; a rewind goes only to a checkpoint of it (DeepSpeed loads it directly)."""
        self.cfg, self.detector, self.run_dir, self.metrics, self.rank, self.shape = \
            cfg, detector, run_dir, metrics, rank, shape
        self.heartbeats = heartbeats or HeartbeatWriter.disabled()
        self.rewinds: list[Rewound] = []

    @classmethod
    def for_engine(cls, cfg: RunConfig, engine, shape: RunShape, run_dir: RunDir, metrics: Metrics, rank: int,
                   heartbeats: HeartbeatWriter) -> "GuardActions":
        """The guard of a run's engine: its detector knows the fp16 loss scale's floor (which, with the guard on,
        skips a step instead of raising: deepspeed_env.engine_state.min_loss_scale) and the warm-up."""
        guard = cfg.guard
        detector = NumericsGuard(guard, cfg.optimizer.warmup_steps,
                                 min_loss_scale(engine, guard_on=guard.action != "off"))
        return cls(guard, detector, run_dir, metrics, rank, shape, heartbeats)

    @property
    def flagged(self) -> bool:
        """The latest step is flagged: no checkpoint may be saved from it."""
        return self.detector.flagged

    @property
    def began(self) -> int | None:
        """First flagged step of the open suspicion (None when the latest step is not flagged)."""
        return self.detector.began

    def restore(self, step: int) -> None:
        """At start-up after `step` steps: the detector and the rewinds of the uninterrupted run at that step."""
        if self.detector.enabled and step > 0:
            self._rebuild(step, with_rewinds=True)

    def protect_steps(self, step: int) -> tuple[int, ...]:
        """Checkpoints keep_last pruning must keep (the run at `step`): the newest one from before an open spike,
        and the one the latest rewind went back to while the run is within that rewind's reach."""
        steps = []
        if self.detector.began is not None:
            before = newest_complete_before(self.run_dir, self.detector.began)
            steps += [before.step] if before is not None else []
        if self.rewinds and step <= self.rewinds[-1].reach:
            steps.append(self.rewinds[-1].to_step)
        return tuple(steps)

    def after_step(self, record: dict, skipped_before: int) -> Rewind | Stop | None:
        """The decision on the step just trained (its train record): None (go on), Rewind or Stop."""
        if not self.detector.enabled:
            return None
        trigger = self.detector.observe(StepFigures.of_record(record, skipped_before))
        if trigger is None:
            return None
        if self.cfg.action == "warn":
            self._record(trigger, "warn", f"numerics guard: warning: {trigger.describe()}")
            self.detector.acknowledged()  # a level the run goes on at: the spike rules take it as the new baseline
            return None
        if self.cfg.action == "stop":
            return self._stop(trigger, "guard.action is stop")
        return self._rewind(trigger)

    def rewound(self, rewind: Rewind) -> None:
        """After the trainer carried out `rewind`: the detector is the run's at the checkpoint's step again (its
        windows hold the pre-spike values, so the same spike coming back is recognised at once)."""
        point, trigger = rewind.point, rewind.trigger
        self._rebuild(point.step, with_rewinds=False)
        self.rewinds.append(Rewound(trigger.rule, trigger.step, point.step, rewind.skip_batches))
        message = (f"numerics guard: {trigger.describe()}; rewound to checkpoint {point.tag} (step {point.step}) and "
                   f"skipped the next {rewind.skip_batches} batches of the data stream (rewind {len(self.rewinds)}/"
                   f"{self.cfg.max_rewinds})")
        self._record(trigger, "rewind", message, to_step=point.step, tag=point.tag,
                     skipped_batches=rewind.skip_batches, seconds=round(time.perf_counter() - rewind.started, 3))

    def _stop(self, trigger: Trigger, why: str) -> Stop:
        point = rewind_point(self.run_dir, trigger.began - 1) if self.rank == 0 and trigger.began >= 1 else None
        resume = f"resume point {point.tag} (step {point.step})" if point else "no checkpoint before it"
        stop = Stop(f"numerics guard: stopped: {trigger.describe()} ({why}); {resume}")
        self._record(trigger, "stop", stop.line, say=False, reason=why)  # the rank prints the stop line last
        return stop

    def _rewind(self, trigger: Trigger) -> Rewind | Stop:
        started = time.perf_counter()
        last = self.rewinds[-1] if self.rewinds else None
        if last is not None and last.rule == trigger.rule and trigger.step <= last.reach:
            return self._stop(trigger, f"the same trigger came back after rewinding to step {last.to_step} and "
                                       f"skipping {last.skipped_batches} batches (within its reach, step "
                                       f"{last.reach}): not a stretch of bad data")
        if len(self.rewinds) >= self.cfg.max_rewinds:
            return self._stop(trigger, f"guard.max_rewinds {self.cfg.max_rewinds} spent")
        with self.heartbeats.phase("guard rewind", trigger.step):  # the hang watchdog bounds the agreement
            point = self._agreed_point(trigger.began - 1)
        if point is None:
            return self._stop(trigger, f"no intact checkpoint of this run's shape at or before step "
                                       f"{trigger.began - 1} to rewind to")
        return Rewind(point, self.cfg.skip_batches or trigger.step - point.step, trigger, started)

    def _rebuild(self, step: int, with_rewinds: bool) -> None:
        """Rank 0 replays the run's records up to `step` (launcher/train/guard_history.py); every rank adopts."""
        box = [None]
        if self.rank == 0:
            history = read_history(self.run_dir, step)
            fresh = NumericsGuard(self.detector.cfg, self.detector.warmup_steps, self.detector.min_loss_scale)
            box[0] = (fresh.replay(history.steps), history.rewinds)
        dist.broadcast_object_list(box, src=0)
        self.detector, rewinds = box[0]
        if with_rewinds:
            self.rewinds = list(rewinds)

    def _record(self, trigger: Trigger, action: str, message: str, say: bool = True, **fields) -> None:
        """The event, the TensorBoard scalars and (say) the console line."""
        self.metrics.event(GUARD_EVENT, action=action, **trigger.to_dict(), message=message, **fields)
        self.metrics.guard_scalars(trigger.step, action, len(self.rewinds))
        if say:
            self.metrics.message(message)

    def _agreed_point(self, at_or_before: int) -> CheckpointEntry | None:
        """Rank 0 picks the newest intact checkpoint at or before the step if it has this run's shape (DeepSpeed
        loads it directly, no conversion), every rank gets it; None otherwise."""
        box = [None]
        if self.rank == 0 and at_or_before >= 0:
            point = rewind_point(self.run_dir, at_or_before)
            if point is not None and RunShape.of_sidecar(point.sidecar) == self.shape:
                box[0] = point
        dist.broadcast_object_list(box, src=0)
        return box[0]


# The guard's two questions to the checkpoint catalogue, in one place.

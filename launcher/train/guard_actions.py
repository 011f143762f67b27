"""What the numerics guard does about a trigger (launcher/train/numerics_guard.py detects): warn, stop, or
rewind to the newest intact checkpoint from before the spike and skip the batches that led into it.

Every rank runs the same code on the same all-reduced figures, so all reach the same verdict with no
extra collective; only a rewind exchanges something (rank 0 picks the checkpoint, all load it).
Every trigger and action is a `guard` event in metrics.jsonl (shown by `roformer report`, marked on the
loss plot) and TensorBoard scalars under guard/.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import deepspeed.comm as dist

from launcher.checkpoint.catalogue import newest_complete_before, rewind_point
from launcher.config.guard_section import GuardSection
from launcher.train.engine import min_loss_scale, precision
from launcher.train.numerics_guard import NumericsGuard, StepFigures, Trigger

GUARD_EVENT = "guard"
"""metrics.jsonl event of every trigger and action: fields action (warn / stop / rewind), rule, step,
began, figure, value, median, threshold, message; a rewind adds to_step, tag, skipped_batches, seconds."""


@dataclass(frozen=True)
class Rewound:
    """One rewind, remembered to recognise the same trigger coming back within its reach."""

    rule: str
    trigger_step: int
    to_step: int
    skipped_batches: int

    @property
    def reach(self) -> int:
        """The last step at which the same rule firing again means the skip did not help."""
        return self.trigger_step + self.skipped_batches


class GuardActions:
    """The trainer's numerics guard: `after_step` once per step on every rank."""

    def __init__(self, cfg: GuardSection, detector: NumericsGuard, trainer):
        self.cfg, self.detector, self.trainer = cfg, detector, trainer
        self.rewinds: list[Rewound] = []
        self.stop_message: str | None = None
        """Set when the guard ended the run: the one line the rank prints last."""

    @property
    def flagged(self) -> bool:
        """The latest step is flagged: no checkpoint may be saved from it."""
        return self.detector.flagged

    def protect_steps(self) -> tuple[int, ...]:
        """Checkpoints keep_last pruning must keep: the newest one from before an open spike, and the one
        the latest rewind went back to while the run is within that rewind's reach."""
        steps = []
        if self.detector.began is not None:
            before = newest_complete_before(self.trainer.checkpointer.run_dir, self.detector.began)
            steps += [before.step] if before is not None else []
        if self.rewinds and self.trainer.state.step <= self.rewinds[-1].reach:
            steps.append(self.rewinds[-1].to_step)
        return tuple(steps)

    def after_step(self, record: dict, skipped_before: int) -> str | None:
        """None (go on), "rewound" (the trainer's state is an older checkpoint's) or "stop"."""
        if not self.detector.enabled:
            return None
        figures = StepFigures(step=record["step"], stage=record["stage"], loss=record["loss"],
                              grad_norm=record["grad_norm"], loss_scale=record["loss_scale"],
                              skipped=record["skipped_steps"] > skipped_before)
        trigger = self.detector.observe(figures)
        if trigger is None:
            return None
        if self.cfg.action == "warn":
            self._record(trigger, "warn", f"numerics guard: warning: {trigger.describe()}")
            self.detector.acknowledged()  # a level the run goes on at: the spike rules take it as the new baseline
            return None
        if self.cfg.action == "stop":
            return self._stop(trigger, "guard.action is stop")
        return self._rewind(trigger)

    def _stop(self, trigger: Trigger, why: str) -> str:
        point = self._catalogue_newest(trigger.began - 1)
        resume = f"resume point {point.tag} (step {point.step})" if point else "no checkpoint before it"
        self.stop_message = f"numerics guard: stopped: {trigger.describe()} ({why}); {resume}"
        self._record(trigger, "stop", None, reason=why)  # the rank prints the stop line last
        return "stop"

    def _rewind(self, trigger: Trigger) -> str:
        last = self.rewinds[-1] if self.rewinds else None
        if last is not None and last.rule == trigger.rule and trigger.step <= last.reach:
            return self._stop(trigger, f"the same trigger came back after rewinding to step {last.to_step} and "
                                       f"skipping {last.skipped_batches} batches (within its reach, step "
                                       f"{last.reach}): not a stretch of bad data")
        if len(self.rewinds) >= self.cfg.max_rewinds:
            return self._stop(trigger, f"guard.max_rewinds {self.cfg.max_rewinds} spent")
        with self.trainer.progress.phase("guard rewind", trigger.step):  # the hang watchdog bounds the reload
            return self._rewind_to_checkpoint(trigger)

    def _rewind_to_checkpoint(self, trigger: Trigger) -> str:
        start = time.perf_counter()
        point = self._agreed_point(trigger.began - 1)
        if point is None:
            return self._stop(trigger, f"no intact checkpoint of this run's shape at or before step "
                                       f"{trigger.began - 1} to rewind to")
        trainer = self.trainer
        trainer.checkpointer.load(point, trainer.cfg.seed)  # weights, optimizer, scaler, counters, data, RNG
        min_loss_scale(trainer.engine, guard_on=True)  # the loaded scaler, too, leaves the floor to the guard
        skipped = self.cfg.skip_batches or trigger.step - point.step
        stage = trainer.stages[trainer.cfg.schedule.stage_for_step(point.step)[0]]
        trainer.batches.skip(stage.max_seq_len, skipped * stage.global_batch_size)
        self.detector.rewound()
        self.rewinds.append(Rewound(trigger.rule, trigger.step, point.step, skipped))
        trainer.metrics.rewind(point.step)  # train records past the checkpoint belong to the abandoned future
        message = (f"numerics guard: {trigger.describe()}; rewound to checkpoint {point.tag} (step {point.step}) and "
                   f"skipped the next {skipped} batches of the data stream (rewind {len(self.rewinds)}/"
                   f"{self.cfg.max_rewinds})")
        self._record(trigger, "rewind", message, to_step=point.step, tag=point.tag, skipped_batches=skipped,
                     seconds=round(time.perf_counter() - start, 3))
        return "rewound"

    def _record(self, trigger: Trigger, action: str, message: str | None, **fields) -> None:
        """The event, the TensorBoard scalars and (message given) the console line."""
        metrics = self.trainer.metrics
        metrics.event(GUARD_EVENT, action=action, **trigger.to_dict(), message=message or self.stop_message, **fields)
        metrics.guard_scalars(trigger.step, action, len(self.rewinds))
        if message:
            metrics.message(message)

    def _catalogue_newest(self, at_or_before: int):
        """Rank 0's view of the newest intact checkpoint at or before the step (for the stop line)."""
        if self.trainer.rank != 0 or at_or_before < 0:
            return None
        return rewind_point(self.trainer.checkpointer.run_dir, at_or_before)

    def _agreed_point(self, at_or_before: int):
        """Rank 0 picks the newest intact checkpoint at or before the step if it has this run's shape (world size,
        ZeRO stage, precision: DeepSpeed loads it directly, no conversion), every rank gets it; None otherwise."""
        trainer = self.trainer
        box = [None]
        if trainer.rank == 0:
            point = self._catalogue_newest(at_or_before)
            engine = trainer.engine
            if point is not None and (point.sidecar.world_size, point.sidecar.zero_stage, point.sidecar.precision) == \
                    (trainer.world_size, engine.zero_optimization_stage(), precision(engine)):
                box[0] = point
        dist.broadcast_object_list(box, src=0)
        return box[0]

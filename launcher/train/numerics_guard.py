"""The numerics guard's detector: pure Python on figures every step already has (no torch, no collective).

Fed once per optimizer step with the step's all-reduced figures (launcher/train/trainer.py: the loss
of all ranks, DeepSpeed's global gradient norm, loss scale and skip count, the same on every rank), so
every rank reaches the same verdict without exchanging anything. Rules (launcher.config.guard_section):

  non_finite_loss        the loss is NaN or infinite
  non_finite_grad_norm   the gradient norm is NaN or infinite on a step the fp16 optimizer did not skip
                         (a skipped overflow step reports an infinite norm by design)
  loss_spike             the loss above spike_factor x the median of the last `window` unflagged steps,
                         `patience` steps in a row (judged after warmup once `min_window` values are in,
                         against the median of what is there; the factor widened by stage_switch_factor
                         for `window` steps after a stage switch)
  grad_norm_spike        the same rule on the gradient norm with grad_norm_factor
  loss_scale_at_minimum  fp16: the loss scale at fp16.min_loss_scale for min_loss_scale_steps in a row
  skipped_steps          fp16: more than max_skipped_share of the last `window` steps skipped

A step that meets a rule's condition is *flagged* (no checkpoint is saved from it); the spike *began*
at the first step of the run of flagged steps that ends in the trigger.

The guard's state is a function of the run's history: `replay` over the figures of steps 1..N gives the
state the uninterrupted run had after step N (launcher/train/guard_history.py reads them from the run's
records), so a resumed, restarted, rewound or branched run is guarded from its first step.
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from launcher.config.guard_section import GuardSection

RULES = ("non_finite_loss", "non_finite_grad_norm", "loss_spike", "grad_norm_spike", "loss_scale_at_minimum",
         "skipped_steps")


@dataclass(frozen=True)
class StepFigures:
    """What one optimizer step reports, identical on every rank."""

    step: int
    """Steps completed, this one included."""
    stage: int
    """Index of the stage the step belongs to."""
    loss: float
    grad_norm: float | None
    """DeepSpeed's global gradient norm (None where DeepSpeed computes none)."""
    loss_scale: float | None
    """The fp16 loss scale after the step (None or 1 without dynamic loss scaling)."""
    skipped: bool
    """The fp16 optimizer skipped the step (overflow)."""

    @classmethod
    def of_record(cls, record: dict, skipped_before: int) -> "StepFigures":
        """The figures of a train record (metrics.jsonl); skipped_before: the fp16 skip counter before the step."""
        return cls(step=record["step"], stage=record["stage"], loss=record["loss"], grad_norm=record.get("grad_norm"),
                   loss_scale=record.get("loss_scale"), skipped=(record.get("skipped_steps") or 0) > skipped_before)


@dataclass(frozen=True)
class Trigger:
    """A rule that fired: what the event, the console line and the stop say."""

    rule: str
    step: int
    """The step it fired at (steps completed)."""
    began: int
    """The first flagged step of the run that led to it (steps completed; the spike began here)."""
    figure: str
    """loss, grad_norm, loss_scale or skipped_share."""
    value: float
    median: float | None = None
    """The window's median the value was compared with (spike rules)."""
    threshold: float | None = None
    """The value at or beyond which the step was flagged."""

    def describe(self) -> str:
        """'loss spike at step 412: loss 14.2 > threshold 13.1 (2 x window median 6.55), since step 410'."""
        what = self.rule.replace("_", " ")
        text = f"{what} at step {self.step}: {self.figure} {self.value:.6g}"
        if self.threshold is not None:
            text += f" vs threshold {self.threshold:.6g}"
        if self.median is not None:
            text += f" (window median {self.median:.6g})"
        if self.began != self.step:
            text += f", flagged since step {self.began}"
        return text

    def to_dict(self) -> dict:
        return asdict(self)


class _SpikeRule:
    """Value above factor x the median of the last `window` unflagged values (at least `min_window` of
    them), `patience` times in a row."""

    def __init__(self, rule: str, figure: str, factor: float, cfg: GuardSection):
        self.rule, self.figure, self.factor = rule, figure, factor
        self.min_window, self.patience = min(cfg.min_window, cfg.window), cfg.patience
        self.history: deque[float] = deque(maxlen=cfg.window)
        self.run_began: int | None = None  # first step of the current run of flagged steps
        self.run_length = 0

    def end_run(self) -> None:
        """Forget the current run of flagged steps (the window, made of unflagged steps only, stays)."""
        self.run_began, self.run_length = None, 0

    def observe(self, step: int, value: float | None, armed: bool, widen: float) -> Trigger | None:
        """Record `value`; a Trigger when the patience is used up. armed False (warmup): history only."""
        if value is None or not math.isfinite(value):
            return None  # the non-finite rules' business
        if not armed or len(self.history) < self.min_window:
            self.history.append(value)
            self.run_began, self.run_length = None, 0
            return None
        median = statistics.median(self.history)
        threshold = self.factor * widen * median
        if value <= threshold:
            self.history.append(value)
            self.run_began, self.run_length = None, 0
            return None
        # Flagged: left out of the window, so a spike never raises its own baseline.
        self.run_began = step if self.run_began is None else self.run_began
        self.run_length += 1
        if self.run_length != self.patience:  # fires once per spike (warn: one event, not one per step)
            return None
        return Trigger(self.rule, step, self.run_began, self.figure, value, median, threshold)

    @property
    def flagged_since(self) -> int | None:
        return self.run_began


class NumericsGuard:
    """One per rank; `observe` every step in order (or `replay` the steps a run already trained)."""

    def __init__(self, cfg: GuardSection, warmup_steps: int, min_loss_scale: float | None):
        """warmup_steps: optimizer warmup (the spike rules stay unarmed through it); min_loss_scale: the
        fp16 scaler's floor (None: no dynamic loss scaling, the fp16 rules are off)."""
        self.cfg, self.warmup_steps, self.min_loss_scale = cfg, warmup_steps, min_loss_scale
        self.loss = _SpikeRule("loss_spike", "loss", cfg.spike_factor, cfg)
        self.grad_norm = _SpikeRule("grad_norm_spike", "grad_norm", cfg.grad_norm_factor, cfg)
        self.skips: deque[bool] = deque(maxlen=cfg.window)
        self.skips_over = False
        self.non_finite: dict[str, int] = {}  # rule -> first step of its current run of non-finite values
        self.at_minimum_since: int | None = None
        self.stage: int | None = None
        self.stage_switched_at = 0
        self.flagged = False
        """The latest observed step met a rule's condition: no checkpoint may be saved from it."""
        self.began: int | None = None
        """First flagged step of the open suspicion (None when the latest step is not flagged)."""

    @property
    def enabled(self) -> bool:
        return self.cfg.action != "off"

    def replay(self, history: Iterable[StepFigures]) -> "NumericsGuard":
        """Observe steps the run trained already (in order, from its first). A rule that fires on them marks a
        level the run went on at (under `stop` or `rewind` its records would have ended there), so it is
        taken as the new baseline, as after a warning."""
        for figures in history:
            if self.observe(figures) is not None:
                self.acknowledged()
        return self

    def acknowledged(self) -> None:
        """After a warning: the spike rules start a new window at the level the run goes on at (else every later
        step would stay flagged and no checkpoint would be written again); a non-finite figure or a loss scale
        at its floor stays flagged while it lasts."""
        for rule in (self.loss, self.grad_norm):
            rule.history.clear()
            rule.end_run()
        self.flagged = bool(self.non_finite) or self.at_minimum_since is not None
        self.began = min([*self.non_finite.values(), *([self.at_minimum_since] if self.at_minimum_since else [])],
                         default=None)

    def observe(self, f: StepFigures) -> Trigger | None:
        """The first rule (in RULES order) that fires on this step, or None; sets `flagged` / `began`."""
        if self.stage is not None and f.stage != self.stage:
            self.stage_switched_at = f.step
        self.stage = f.stage
        armed = f.step > self.warmup_steps
        widen = self.cfg.stage_switch_factor if self.stage_switched_at and \
            f.step - self.stage_switched_at < self.cfg.window else 1.0
        triggers = [
            self._non_finite("non_finite_loss", "loss", f.step, f.loss),
            self._non_finite("non_finite_grad_norm", "grad_norm", f.step, None if f.skipped else f.grad_norm),
            self.loss.observe(f.step, f.loss, armed, widen),
            self.grad_norm.observe(f.step, None if f.skipped else f.grad_norm, armed, widen),
            self._loss_scale(f),
            self._skipped_share(f),
        ]
        starts = [s for s in (self.loss.flagged_since, self.grad_norm.flagged_since, self.at_minimum_since,
                              *self.non_finite.values()) if s]
        starts += [t.began for t in triggers if t is not None]
        self.flagged = bool(starts)
        self.began = min(starts) if starts else None
        return next((t for t in triggers if t is not None), None)

    def _non_finite(self, rule: str, figure: str, step: int, value: float | None) -> Trigger | None:
        """Fires on the first of a run of non-finite values (flagged on every one of them)."""
        if value is None or math.isfinite(value):
            self.non_finite.pop(rule, None)
            return None
        if rule in self.non_finite:
            return None
        self.non_finite[rule] = step
        return Trigger(rule, step, step, figure, value)

    def _loss_scale(self, f: StepFigures) -> Trigger | None:
        if self.min_loss_scale is None or f.loss_scale is None or f.loss_scale > self.min_loss_scale:
            self.at_minimum_since = None
            return None
        self.at_minimum_since = self.at_minimum_since or f.step
        if f.step - self.at_minimum_since + 1 != self.cfg.min_loss_scale_steps:
            return None
        return Trigger("loss_scale_at_minimum", f.step, self.at_minimum_since, "loss_scale", f.loss_scale,
                       threshold=self.min_loss_scale)

    def _skipped_share(self, f: StepFigures) -> Trigger | None:
        if self.min_loss_scale is None:
            return None
        self.skips.append(f.skipped)
        if len(self.skips) < self.cfg.window:
            return None
        share, was_over = sum(self.skips) / len(self.skips), self.skips_over
        self.skips_over = share > self.cfg.max_skipped_share
        if not self.skips_over or was_over:
            return None
        began = f.step - len(self.skips) + 1 + self.skips.index(True)
        return Trigger("skipped_steps", f.step, began, "skipped_share", share, threshold=self.cfg.max_skipped_share)

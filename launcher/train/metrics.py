"""Rank-0 reporting: RUN_DIR/metrics.jsonl, the sinks of `logging.report_to` and progress lines with ETAs.

One JSON object per line (`kind` train, valid or event); `step` counts optimizer steps completed
(launcher/run_dir/metrics_format.py). On resume from step N, train/valid lines past N are dropped (and
TensorBoard purged), so the file reads as one run; redone steps (a restart from an older checkpoint, a
guard rewind) get an `attempt` event and number. Each record goes to metrics.jsonl first, then to each sink.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from launcher.config.run_config import RunConfig
from launcher.config.schedule import format_tokens
from launcher.config.stages import ResolvedStage, entry_at, stage_ends
from launcher.common.io import atomic_write_text, write_line, write_line_kept
from launcher.run_dir.metrics_format import FORMAT_EVENT, format_event, read_records
from launcher.run_dir.layout import RunDir
from launcher.common.mfu import Peak, resolve_peak, speed_fields
from launcher.tracking.open_sinks import TrackedRun, open_sinks
from launcher.train.progress_line import ProgressPrinter, progress_every
from launcher.train.stop_time import StopTime

OUTCOME_EVENTS = ("finished", "stopped", "guard_stopped")


@dataclass(frozen=True)
class MetricsOptions:
    """How rank 0 reports a run (its logging section, the schedule's end, the preemption grace)."""

    total_steps: int
    log_every: int
    """Steps between train records."""
    progress_bar: bool
    """False: no progress lines at all."""
    progress_every: int = 1
    """Steps between plain progress lines (launcher/train/progress_line.py)."""
    preemption_grace: float | None = None
    """restarts.preemption_grace_seconds, for the stop-time line (launcher/train/stop_time.py)."""
    tokens_before: Callable[[int], int] | None = None
    """Token slots of the first N steps, for a schedule in tokens (TensorBoard's tokens axis, the progress line's
    tokens done of the whole schedule's); None in steps."""

    @property
    def total_tokens(self) -> int:
        """Token slots of the whole schedule written in tokens; 0 for a schedule in steps."""
        return 0 if self.tokens_before is None else self.tokens_before(self.total_steps)

    @classmethod
    def of_run_config(cls, cfg: RunConfig) -> "MetricsOptions":
        total, in_tokens = cfg.schedule.total_steps, cfg.schedule.in_tokens
        return cls(total, cfg.logging.log_every, cfg.logging.progress_bar,
                   progress_every(cfg.logging.progress_every, total), cfg.restarts.preemption_grace_seconds,
                   cfg.schedule.tokens_before if in_tokens else None)


class Metrics:
    """Does nothing on ranks other than 0, so the loop can call it unconditionally."""

    def __init__(self, run_dir: RunDir, rank: int, stages: list[ResolvedStage], start_step: int,
                 options: MetricsOptions, tracking: TrackedRun = TrackedRun()):
        """start_step: steps completed when the run (re)starts; tracking: the sinks and what a tracker gets for
        the run as a whole (launcher/tracking/)."""
        self.active = rank == 0
        total_steps, log_every = options.total_steps, options.log_every
        self.stages, self.total_steps, self.log_every = stages, total_steps, log_every
        self.total_tokens = options.total_tokens
        self.tokens_per_s: float | None = None  # smoothed, for the ETAs
        self.peak: Peak | None = None  # set by set_peak(); tflops / mfu need it
        self.stop_time: StopTime | None = None
        if not self.active:
            return
        self.path = run_dir.metrics
        kept, self.attempt, redone = _truncate_from(self.path, start_step)
        if options.preemption_grace is not None:
            self.stop_time = StopTime(options.preemption_grace, self.message, kept)
        self.jsonl = open(self.path, "a", encoding="utf-8")
        self.outcome: str | None = None
        self.sinks = open_sinks(tracking.report_to, run_dir, start_step, log_every, total_steps,
                                stage_ends(stages), tracking.params, tracking.tags,
                                tokens_before=options.tokens_before)
        for sink in self.sinks:
            sink.start(kept, start_step)
        if redone:
            self._new_attempt(start_step, "restart from an older checkpoint")
        self.progress = ProgressPrinter(total_steps, options.progress_every) if options.progress_bar else None

    def set_peak(self, peak: Peak) -> None:
        """The peak MFU is measured against, from now on (recorded as a `peak_flops` event)."""
        self.peak = peak
        self.event("peak_flops", **peak.to_dict())

    def report_start(self, timer, plan, world_size: int, scale: float | None, skipped: int, trained_in: str,
                     peak_tflops: float) -> None:
        """The start-up's events: `resume` (and its console line) on a start from a checkpoint, `startup` (phases and
        memory of `timer`, a PhaseTimer), one `resume_note` per line the resume `plan` said, then rank 0's peak for
        MFU (logging.peak_tflops, else the table, else a timed matmul on CPU). `scale`, `skipped`, `trained_in`: the
        engine's loss scale, skipped steps and precision."""
        if plan.source is not None:
            seconds = timer.phases["checkpoint_load"]
            self.event("resume", step=plan.step, tag=plan.source.tag, from_world_size=plan.source.sidecar.world_size,
                       world_size=world_size, universal=plan.universal, seconds=seconds, loss_scale=scale,
                       skipped_steps=skipped)
            self.message(f"resumed from {plan.source.tag} (step {plan.step}) in {seconds:.2f} s"
                         f"{' via a universal checkpoint' if plan.universal else ''}")
        self.event("startup", step=plan.step, seconds=time.time() - timer.process_start,
                   phases={k: round(v, 3) for k, v in timer.phases.items()}, resident_bytes=timer.resident)
        for note in plan.notes:  # the route, damaged checkpoints set aside, a new config version (printed already)
            self.event("resume_note", step=plan.step, message=note)
        if not self.active:
            return
        measured_from = time.perf_counter()
        peak = resolve_peak(peak_tflops, trained_in)
        self.set_peak(peak)
        if peak.source == "measured":
            self.message(f"peak for MFU: {peak.tflops:.3f} TFLOP/s fp32 (matmul measured in "
                         f"{time.perf_counter() - measured_from:.1f} s)")
        elif peak.tflops is None:
            self.message(f"peak for MFU: unknown for {peak.device!r} ({peak.precision}); set logging.peak_tflops "
                         "to report MFU")

    def train_step(self, record: dict) -> None:
        """record: step (steps completed, this one included), the fields of launcher/tracking/tensorboard.py's
        TRAIN_SCALARS and
        model_flops_per_rank (from which `tflops` and `mfu` are added)."""
        flops = record.pop("model_flops_per_rank", None)
        if flops is not None and self.peak is not None:
            record.update(speed_fields(flops, record["step_time_s"], self.peak))
        tokens = record.get("tokens_per_s")
        if tokens:
            self.tokens_per_s = tokens if self.tokens_per_s is None else 0.9 * self.tokens_per_s + 0.1 * tokens
        if not self.active:
            return
        if self.stop_time is not None:
            self.stop_time.step(record["step_time_s"])
        self._write({"kind": "train", **record, "attempt": self.attempt})
        step = record["step"]
        if self.progress is not None:
            self.progress.step(step, lambda: self.progress_text(record))

    def progress_text(self, record: dict) -> str:
        """'step 120/570 (21%) | loss 7.012 acc 0.081 | ETA run 03:10, stage 00:48 | short 1/3: len 64 x
        batch 32 | 5,120 tok/s ...' for the train record of a step (what matters most first: a narrow
        terminal cuts the status line at its end). A schedule in tokens adds its token slots done of all after
        the steps: 'step 120/570 (21%) 1.23M/2.06M tok | ...'."""
        step, stage = record["step"], entry_at(self.stages, record["step"] - 1)
        return (f"step {step:,}/{self.total_steps:,} ({100 * step // self.total_steps}%){self._tokens_text(record)} | "
                f"loss {record['loss']:.3f} acc {record['mlm_accuracy']:.3f} | "
                f"ETA run {_fmt(self.eta(stage, step, self.total_steps))}, "
                f"stage {_fmt(self.eta(stage, step, stage.stage_end_step))} | "
                f"{stage.name} {stage.index + 1}/{self.stages[-1].index + 1}: len {stage.max_seq_len} x batch "
                f"{stage.global_batch_size} | {self.tokens_per_s or 0:,.0f} tok/s {_fmt_speed(record)}".rstrip())

    def _tokens_text(self, record: dict) -> str:
        """' 1.23M/2.06M tok' (the record's schedule_tokens of the schedule's total) for a schedule in tokens, else ''."""
        done = record.get("schedule_tokens")
        if not self.total_tokens or not isinstance(done, int):
            return ""
        return f" {format_tokens(done)}/{format_tokens(self.total_tokens)} tok"

    def eta(self, stage: ResolvedStage, from_step: int, to_step: int) -> float | None:
        """Seconds from `from_step` to `to_step` steps completed at the smoothed token rate (stages differ
        in tokens/step)."""
        if not self.tokens_per_s:
            return None
        tokens = 0
        for s in self.stages:
            lo, hi = max(from_step, s.first_step), min(to_step, s.end_step)
            if hi > lo:
                tokens += (hi - lo) * s.global_batch_size * s.max_seq_len
        return tokens / self.tokens_per_s

    def validation(self, step: int, stage: int, loss: float, accuracy: float, seconds: float) -> None:
        if not self.active:
            return
        self._write({"kind": "valid", "step": step, "stage": stage, "loss": loss, "mlm_accuracy": accuracy,
                     "seconds": round(seconds, 4), "attempt": self.attempt})
        self.message(f"validation at step {step}: loss {loss:.4f}, MLM accuracy {accuracy:.4f}")

    def event(self, event: str, **fields) -> None:
        if not self.active:
            return
        if event in OUTCOME_EVENTS:
            self.outcome = event
        self._write({"kind": "event", "event": event, "time": time.time(), **fields})
        if event == "checkpoint" and self.stop_time is not None:
            self.stop_time.checkpoint(fields["seconds"])

    def rewind(self, step: int) -> None:
        """The numerics guard went back to the checkpoint of `step`: train/valid records past it are dropped from
        metrics.jsonl and TensorBoard (as on a resume), so both read as one consistent run; events stay. The steps
        redone from there are a new attempt (trackers keep the abandoned ones, told apart by it)."""
        if not self.active:
            return
        self.jsonl.close()
        _truncate_from(self.path, step)
        self.jsonl = open(self.path, "a", encoding="utf-8")
        for sink in self.sinks:
            sink.rewind(step)
        self._new_attempt(step, "guard rewind")

    def guard_scalars(self, step: int, action: str, rewinds: int) -> None:
        """The sinks' guard figures (TensorBoard: guard/<action> at the trigger's step, guard/rewinds so far)."""
        if not self.active:
            return
        for sink in self.sinks:
            sink.guard_scalars(step, action, rewinds)

    def message(self, text: str, kept: bool = False) -> None:
        """One line on the console (rank 0 only); `kept`: also in the rank's log (launcher.common.io.write_line_kept),
        for the lines of a stop, which the console may not carry any more."""
        if self.active:
            (write_line_kept if kept else write_line)(text)

    def close(self) -> None:
        if not self.active:
            return
        self.jsonl.close()
        for sink in self.sinks:
            sink.close(self.outcome)

    def _new_attempt(self, step: int, cause: str) -> None:
        self.attempt += 1
        self.event("attempt", step=step, attempt=self.attempt, cause=cause)

    def _write(self, record: dict) -> None:
        self.jsonl.write(json.dumps(record) + "\n")
        self.jsonl.flush()
        for sink in self.sinks:
            sink.record(record)


def read_metrics(run_dir: Path, kind: str = "train") -> list[dict]:
    """The records of one kind in RUN_DIR/metrics.jsonl, in order, steps counted as steps completed
    whatever the file's format ([] before the first step)."""
    return [r for r in read_records(RunDir(Path(run_dir)).metrics) if r.get("kind") == kind]


def read_all_records(run_dir: RunDir) -> list[dict]:
    """Every record of RUN_DIR/metrics.jsonl, all kinds, in the order written (steps as read_metrics counts them)."""
    return read_records(run_dir.metrics)


def _truncate_from(path: Path, start_step: int) -> tuple[list[dict], int, bool]:
    """Rewrite metrics.jsonl for a (re)start after `start_step` steps: the format marker first, then the
    records of steps up to start_step (an older file's converted to steps completed) and every event.
    Returns the records kept, the file's attempt number so far and whether records past start_step were dropped
    (their steps are about to be redone)."""
    records = [r for r in read_records(path) if r.get("event") != FORMAT_EVENT]
    kept = [r for r in records if r.get("kind") == "event" or r.get("step", -1) <= start_step]
    attempt = max([int(r.get("attempt") or 0) for r in records if r.get("kind") != "event" or r.get("event") == "attempt"],
                  default=0)
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in [format_event(), *kept]))
    return kept, attempt, len(kept) < len(records)


def _fmt_speed(record: dict) -> str:
    """'1.23 TFLOP/s MFU 41% ' (per rank) when the record has them, else ''."""
    if record.get("tflops") is None:
        return ""
    mfu = f"MFU {100 * record['mfu']:.0f}% " if record.get("mfu") is not None else ""
    return f"{record['tflops']:.3g} TFLOP/s {mfu}"


def _fmt(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60:02d}:{rest % 60:02d}"

"""Rank-0 reporting: TensorBoard scalars, RUN_DIR/metrics.jsonl and progress lines with ETAs.

metrics.jsonl holds one JSON object per line, `kind` = "train" (every step), "valid" or "event";
the first line is the `metrics_format` event. Every `step` counts optimizer steps completed
(launcher/run_dir/metrics_format.py): the first train record has step 1, a validation or checkpoint after
N steps has step N, as does TensorBoard's x axis. On resume from step N, train/valid lines past N
are dropped (they belong to the lost future of the interrupted run), so the file always reads as
one consistent run; TensorBoard gets the same treatment through SummaryWriter's purge_step.
Console output: launcher/train/progress_line.py.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from launcher.config.stages import ResolvedStage
from launcher.io import atomic_write_text, write_line
from launcher.run_dir.metrics_format import FORMAT_EVENT, format_event, normalise
from launcher.run_dir.layout import RunDir
from launcher.mfu import Peak, speed_fields
from launcher.train.progress_line import ProgressPrinter
from launcher.train.stop_time import StopTime

# TensorBoard tag of each train-record field.
TRAIN_SCALARS = {
    "loss": "train/loss", "mlm_accuracy": "train/mlm_accuracy", "lr": "train/lr", "loss_scale": "train/loss_scale",
    "grad_norm": "train/grad_norm", "skipped_steps": "train/skipped_steps", "stage": "schedule/stage",
    "max_seq_len": "schedule/max_seq_len", "global_batch_size": "schedule/global_batch_size",
    "tokens_per_s": "speed/tokens_per_s", "samples_per_s": "speed/samples_per_s", "step_time_s": "speed/step_time_s",
    "tflops": "speed/tflops_per_rank", "mfu": "speed/mfu",
}


class Metrics:
    """Does nothing on ranks other than 0, so the loop can call it unconditionally."""

    def __init__(self, run_dir: RunDir, rank: int, stages: list[ResolvedStage], total_steps: int, start_step: int,
                 log_every: int, progress_bar: bool, progress_every: int = 1, preemption_grace: float | None = None):
        """start_step: steps completed when the run (re)starts; progress_every: steps between plain
        progress lines (launcher/train/progress_line.py); progress_bar False: no progress lines at all;
        preemption_grace: restarts.preemption_grace_seconds, for the stop-time line (launcher/train/stop_time.py)."""
        self.active = rank == 0
        self.stages, self.total_steps, self.log_every = stages, total_steps, log_every
        self.tokens_per_s: float | None = None  # smoothed, for the ETAs
        self.peak: Peak | None = None  # set by set_peak(); tflops / mfu need it
        self.stop_time: StopTime | None = None
        if not self.active:
            return
        self.path = run_dir.metrics
        history = _truncate_from(self.path, start_step)
        if preemption_grace is not None:
            self.stop_time = StopTime(preemption_grace, self.message, history)
        self.jsonl = open(self.path, "a", encoding="utf-8")
        from torch.utils.tensorboard import SummaryWriter

        self.tb = SummaryWriter(str(run_dir.tensorboard), purge_step=start_step + 1 if start_step > 0 else None)
        self.progress = ProgressPrinter(total_steps, progress_every) if progress_bar else None

    def set_peak(self, peak: Peak) -> None:
        """The peak MFU is measured against, from now on (recorded as a `peak_flops` event)."""
        self.peak = peak
        self.event("peak_flops", **peak.to_dict())

    def train_step(self, record: dict) -> None:
        """record: step (steps completed, this one included), the TRAIN_SCALARS fields and
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
        self._write({"kind": "train", **record})
        step = record["step"]
        if step == 1 or step % self.log_every == 0 or step == self.total_steps:
            for key, tag in TRAIN_SCALARS.items():
                if record.get(key) is not None:
                    self.tb.add_scalar(tag, record[key], step)
        if self.progress is not None:
            self.progress.step(step, lambda: self.progress_text(record))

    def progress_text(self, record: dict) -> str:
        """'step 120/570 (21%) | loss 7.012 acc 0.081 | ETA run 03:10, stage 00:48 | short 1/3: len 64 x
        batch 32 | 5,120 tok/s ...' for the train record of a step (what matters most first: a narrow
        terminal cuts the status line at its end)."""
        step, stage = record["step"], self.stages[record["stage"]]
        return (f"step {step:,}/{self.total_steps:,} ({100 * step // self.total_steps}%) | "
                f"loss {record['loss']:.3f} acc {record['mlm_accuracy']:.3f} | "
                f"ETA run {_fmt(self.eta(stage, step, self.total_steps))}, "
                f"stage {_fmt(self.eta(stage, step, stage.end_step))} | "
                f"{stage.name} {stage.index + 1}/{len(self.stages)}: len {stage.max_seq_len} x batch "
                f"{stage.global_batch_size} | {self.tokens_per_s or 0:,.0f} tok/s {_fmt_speed(record)}".rstrip())

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
                     "seconds": round(seconds, 4)})
        self.tb.add_scalar("valid/loss", loss, step)
        self.tb.add_scalar("valid/mlm_accuracy", accuracy, step)
        self.message(f"validation at step {step}: loss {loss:.4f}, MLM accuracy {accuracy:.4f}")

    def event(self, event: str, **fields) -> None:
        if not self.active:
            return
        self._write({"kind": "event", "event": event, "time": time.time(), **fields})
        if event == "checkpoint" and self.stop_time is not None:
            self.stop_time.checkpoint(fields["seconds"])
        if "seconds" in fields:
            self.tb.add_scalar(f"timing/{event}_s", fields["seconds"], fields.get("step", 0))

    def rewind(self, step: int) -> None:
        """The numerics guard went back to the checkpoint of `step`: train/valid records past it are dropped from
        metrics.jsonl and TensorBoard (as on a resume), so both read as one consistent run; events stay."""
        if not self.active:
            return
        self.jsonl.close()
        _truncate_from(self.path, step)
        self.jsonl = open(self.path, "a", encoding="utf-8")
        from torch.utils.tensorboard import SummaryWriter

        log_dir = self.tb.log_dir
        self.tb.close()
        self.tb = SummaryWriter(log_dir, purge_step=step + 1)

    def guard_scalars(self, step: int, action: str, rewinds: int) -> None:
        """TensorBoard: guard/<action> (1 at each trigger's step) and guard/rewinds (rewinds so far)."""
        if not self.active:
            return
        self.tb.add_scalar(f"guard/{action}", 1.0, step)
        self.tb.add_scalar("guard/rewinds", rewinds, step)

    def message(self, text: str) -> None:
        """One line on the console (rank 0 only)."""
        if self.active:
            write_line(text)

    def close(self) -> None:
        if not self.active:
            return
        self.tb.flush()
        self.tb.close()
        self.jsonl.close()

    def _write(self, record: dict) -> None:
        self.jsonl.write(json.dumps(record) + "\n")
        self.jsonl.flush()


def read_metrics(run_dir: Path, kind: str = "train") -> list[dict]:
    """The records of one kind in RUN_DIR/metrics.jsonl, in order, steps counted as steps completed
    whatever the file's format ([] before the first step)."""
    return [r for r in _read_all(RunDir(Path(run_dir)).metrics) if r.get("kind") == kind]


def read_all_records(run_dir: RunDir) -> list[dict]:
    """Every record of RUN_DIR/metrics.jsonl, all kinds, in the order written (steps as read_metrics counts them)."""
    return _read_all(run_dir.metrics)


def _read_all(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a kill
            continue
        if isinstance(record, dict):
            records.append(record)
    return normalise(records)


def _truncate_from(path: Path, start_step: int) -> list[dict]:
    """Rewrite metrics.jsonl for a (re)start after `start_step` steps: the format marker first, then the
    records of steps up to start_step (an older file's converted to steps completed) and every event;
    returns the records kept."""
    kept = [r for r in _read_all(path) if r.get("event") != FORMAT_EVENT
            and (r.get("kind") == "event" or r.get("step", -1) <= start_step)]
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in [format_event(), *kept]))
    return kept


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

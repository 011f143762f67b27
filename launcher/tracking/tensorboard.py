"""TensorBoard scalars of rank 0's records (RUN_DIR/tb), the default sink. On a resume or a rewind to step
N, SummaryWriter's purge_step drops what TensorBoard had past N, as metrics.jsonl drops those records.

A schedule in tokens also gets the main curves against its token slots (RUN_DIR/tb/by_tokens, tags `by_tokens/...`,
as Megatron-LM logs "vs tokens"): a writer of its own, since purge_step counts in its writer's x units."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from launcher.deepspeed_env.lean_imports import summary_writer_class
from launcher.tracking.sink import Sink

# TensorBoard tag of each train-record field.
TRAIN_SCALARS = {
    "loss": "train/loss", "mlm_accuracy": "train/mlm_accuracy", "lr": "train/lr", "loss_scale": "train/loss_scale",
    "grad_norm": "train/grad_norm", "skipped_steps": "train/skipped_steps", "stage": "schedule/stage",
    "max_seq_len": "schedule/max_seq_len", "global_batch_size": "schedule/global_batch_size",
    "tokens_per_s": "speed/tokens_per_s", "samples_per_s": "speed/samples_per_s", "step_time_s": "speed/step_time_s",
    "tflops": "speed/tflops_per_rank", "mfu": "speed/mfu",
    # tokens as the run counts them: non-padding tokens trained (all ranks) and the schedule's token slots
    # (batch x length per step: the unit of a schedule in tokens); TensorBoard's x stays the step
    "consumed_tokens": "train/consumed_tokens", "schedule_tokens": "schedule/tokens",
}
NOISE_SCALARS = {"grad_noise_scale": "noise/critical_batch", "grad_sq_norm": "noise/grad_sq_norm",
                 "grad_noise_trace": "noise/grad_noise_trace"}
"""The gradient noise scale (launcher/train/noise_scale.py): on every step that measured it, whatever log_every."""
TOKEN_AXIS_SCALARS = {"loss": "by_tokens/loss", "mlm_accuracy": "by_tokens/mlm_accuracy", "lr": "by_tokens/lr",
                      "global_batch_size": "by_tokens/global_batch_size"}
"""Drawn against the schedule's token slots (a train record's schedule_tokens) for a schedule in tokens."""


class TensorBoardSink(Sink):
    name = "tensorboard"

    def __init__(self, log_dir: Path, start_step: int, log_every: int, total_steps: int,
                 tokens_before: Callable[[int], int] | None = None):
        """tokens_before: token slots of the first N steps, for a schedule in tokens (None: steps only)."""
        self.log_every, self.total_steps, self.tokens_before = log_every, total_steps, tokens_before
        self.tb = _writer(Path(log_dir), start_step + 1 if start_step > 0 else None)
        self.by_tokens = None if tokens_before is None else \
            _writer(Path(log_dir) / "by_tokens", tokens_before(start_step) + 1 if start_step > 0 else None)

    def record(self, record: dict) -> None:
        kind, step = record.get("kind"), record.get("step", 0)
        if kind == "train":
            if step == 1 or step % self.log_every == 0 or step == self.total_steps:
                for key, tag in TRAIN_SCALARS.items():
                    if record.get(key) is not None:
                        self.tb.add_scalar(tag, record[key], step)
                if self.by_tokens is not None and isinstance(record.get("schedule_tokens"), int):
                    for key, tag in TOKEN_AXIS_SCALARS.items():
                        if record.get(key) is not None:
                            self.by_tokens.add_scalar(tag, record[key], record["schedule_tokens"])
            for key, tag in NOISE_SCALARS.items():
                if record.get(key) is not None:
                    self.tb.add_scalar(tag, record[key], step)
        elif kind == "valid":
            self.tb.add_scalar("valid/loss", record["loss"], step)
            self.tb.add_scalar("valid/mlm_accuracy", record["mlm_accuracy"], step)
        elif kind == "event" and "seconds" in record:
            self.tb.add_scalar(f"timing/{record['event']}_s", record["seconds"], step)

    def rewind(self, step: int) -> None:
        self.tb.close()
        self.tb = _writer(Path(self.tb.log_dir), step + 1)
        if self.by_tokens is not None:
            self.by_tokens.close()
            self.by_tokens = _writer(Path(self.by_tokens.log_dir), self.tokens_before(step) + 1)

    def guard_scalars(self, step: int, action: str, rewinds: int) -> None:
        """guard/<action> (1 at each trigger's step) and guard/rewinds (rewinds so far)."""
        self.tb.add_scalar(f"guard/{action}", 1.0, step)
        self.tb.add_scalar("guard/rewinds", rewinds, step)

    def close(self, outcome: str | None = None) -> None:
        for writer in (self.tb, self.by_tokens):
            if writer is not None:
                writer.flush()
                writer.close()


def _writer(log_dir: Path, purge_step: int | None):
    """A SummaryWriter of `log_dir` that drops what it held from x = purge_step on (a resume's or rewind's)."""
    return summary_writer_class()(str(log_dir), purge_step=purge_step)

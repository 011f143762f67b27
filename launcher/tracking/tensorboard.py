"""TensorBoard scalars of rank 0's records (RUN_DIR/tb), the default sink. On a resume or a rewind to step
N, SummaryWriter's purge_step drops what TensorBoard had past N, as metrics.jsonl drops those records."""
from __future__ import annotations

from pathlib import Path

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


class TensorBoardSink(Sink):
    name = "tensorboard"

    def __init__(self, log_dir: Path, start_step: int, log_every: int, total_steps: int):
        from torch.utils.tensorboard import SummaryWriter

        self.log_every, self.total_steps = log_every, total_steps
        self.tb = SummaryWriter(str(log_dir), purge_step=start_step + 1 if start_step > 0 else None)

    def record(self, record: dict) -> None:
        kind, step = record.get("kind"), record.get("step", 0)
        if kind == "train":
            if step == 1 or step % self.log_every == 0 or step == self.total_steps:
                for key, tag in TRAIN_SCALARS.items():
                    if record.get(key) is not None:
                        self.tb.add_scalar(tag, record[key], step)
        elif kind == "valid":
            self.tb.add_scalar("valid/loss", record["loss"], step)
            self.tb.add_scalar("valid/mlm_accuracy", record["mlm_accuracy"], step)
        elif kind == "event" and "seconds" in record:
            self.tb.add_scalar(f"timing/{record['event']}_s", record["seconds"], step)

    def rewind(self, step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        log_dir = self.tb.log_dir
        self.tb.close()
        self.tb = SummaryWriter(log_dir, purge_step=step + 1)

    def guard_scalars(self, step: int, action: str, rewinds: int) -> None:
        """guard/<action> (1 at each trigger's step) and guard/rewinds (rewinds so far)."""
        self.tb.add_scalar(f"guard/{action}", 1.0, step)
        self.tb.add_scalar("guard/rewinds", rewinds, step)

    def close(self, outcome: str | None = None) -> None:
        self.tb.flush()
        self.tb.close()

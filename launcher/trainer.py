"""The per-rank training loop: stages switch inside one DeepSpeed engine, checkpoints are atomic.

Loss normalisation: an optimizer step sums token cross-entropies over all micro-batches of all
ranks and divides by the global number of masked tokens (all-reduced once per step). DeepSpeed
averages gradients over the data-parallel ranks, so each micro-batch's backward gets
loss_sum * world_size / global_masked, with DeepSpeed's own 1/grad-accum scaling switched off.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import deepspeed.comm as dist
import torch

from data_pipeline.masking import IGNORE_INDEX
from launcher import checkpoint as ckpt
from launcher.batching import ResolvedStage, stage_for_step
from launcher.config import RunConfig
from launcher.metrics import Metrics
from launcher.schedule import learning_rate


@dataclass
class TrainState:
    """Counters saved in every checkpoint; with the data state they define where the run is."""

    step: int = 0
    """Optimizer steps completed (= index of the next step), skipped fp16 steps included."""
    consumed_samples: int = 0
    """Sequences trained on, over all ranks."""
    consumed_tokens: int = 0
    """Non-padding tokens trained on, over all ranks."""
    last_validation: dict = field(default_factory=dict)
    """Loss / accuracy of the latest validation (shown in the checkpoint sidecar)."""


class Trainer:
    def __init__(self, engine, batches, valid_batches, stages: list[ResolvedStage], run_config: RunConfig,
                 run_dir: Path, metrics: Metrics, state: TrainState, model_config: dict):
        self.engine, self.batches, self.valid_batches = engine, batches, valid_batches
        self.stages, self.cfg, self.run_dir, self.metrics, self.state = stages, run_config, run_dir, metrics, state
        self.model_config = model_config
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.total_steps = stages[-1].end_step
        self.stop_signalled = False  # set by a signal handler on this rank
        self.stop_agreed = False     # all ranks know (carried by the per-step all-reduce)

    def run(self) -> str:
        """Train to the end of the schedule ("finished") or until a stop signal ("stopped")."""
        stage = None
        while self.state.step < self.total_steps:
            current, _ = stage_for_step(self.stages, self.state.step)
            if current is not stage:
                stage = self.switch_to(current)
            self.metrics.train_step(self.train_step(stage))
            self.state.step += 1
            stage_done = self.state.step == stage.end_step
            every = self.cfg.logging.valid_every
            if stage_done or (every and self.state.step % every == 0):
                self.validate(stage)
            every = self.cfg.checkpoint.every_steps
            if stage_done or self.stop_agreed or (every and self.state.step % every == 0):
                tag = self.save_checkpoint(stage)
                if stage_done:
                    self.stage_end_evals(stage, tag)
            if self.stop_agreed and self.state.step < self.total_steps:
                return "stopped"
        return "finished"

    def switch_to(self, stage: ResolvedStage) -> ResolvedStage:
        """New length and batch for the running engine (no rebuild): micro-batch, then grad-accum."""
        start = time.perf_counter()
        self.engine.set_train_micro_batch_size(stage.micro_batch_size)
        self.engine.set_train_batch_size(stage.global_batch_size)
        assert self.engine.gradient_accumulation_steps() == stage.grad_accum_steps
        self.metrics.event("stage_start", step=self.state.step, stage=stage.index, name=stage.name,
                           max_seq_len=stage.max_seq_len, global_batch_size=stage.global_batch_size,
                           micro_batch_size=stage.micro_batch_size, grad_accum_steps=stage.grad_accum_steps,
                           seconds=time.perf_counter() - start)
        self.metrics.message(f"stage {stage.index + 1}/{len(self.stages)} '{stage.name}' from step "
                             f"{self.state.step + 1}: max_seq_len {stage.max_seq_len}, global batch "
                             f"{stage.global_batch_size} = {stage.micro_batch_size} x {stage.grad_accum_steps} "
                             f"x {self.world_size}")
        return stage

    def train_step(self, stage: ResolvedStage) -> dict:
        start = time.perf_counter()
        lr = learning_rate(self.state.step, self.total_steps, self.cfg.optimizer.lr, self.cfg.optimizer.warmup_steps,
                           self.cfg.optimizer.decay, self.cfg.optimizer.min_lr_ratio, stage.lr_scale)
        for group in self.engine.optimizer.param_groups:
            group["lr"] = lr
        micro = [self._to_device(self.batches.next_batch(stage.max_seq_len, stage.micro_batch_size))
                 for _ in range(stage.grad_accum_steps)]
        # One all-reduce before backward: masked tokens (the loss denominator), real tokens, stop flag.
        counts = torch.tensor([sum(int((b["labels"] != IGNORE_INDEX).sum()) for b in micro),
                               sum(int(b["attention_mask"].sum()) for b in micro), float(self.stop_signalled)],
                              dtype=torch.float64, device=self.engine.device)
        dist.all_reduce(counts)
        global_masked, global_tokens, stops = counts.tolist()
        self.stop_agreed = stops > 0
        scale = self.world_size / max(global_masked, 1.0)
        sums = torch.zeros(2, dtype=torch.float64, device=self.engine.device)  # loss_sum, correct
        for i, batch in enumerate(micro):
            self.engine.set_gradient_accumulation_boundary(i == len(micro) - 1)
            out = self.engine(**batch)
            self.engine.backward(out.loss_sum * scale, scale_wrt_gas=False)
            self.engine.step()
            sums += torch.stack([out.loss_sum.detach().double(), out.num_correct.double()])
        dist.all_reduce(sums)
        seconds = time.perf_counter() - start
        samples = stage.global_batch_size
        self.state.consumed_samples += samples
        self.state.consumed_tokens += int(global_tokens)
        grad_norm = self.engine.get_global_grad_norm()
        return {"step": self.state.step, "stage": stage.index, "loss": sums[0].item() / max(global_masked, 1.0),
                "mlm_accuracy": sums[1].item() / max(global_masked, 1.0), "lr": lr,
                "loss_scale": loss_scale(self.engine), "grad_norm": None if grad_norm is None else float(grad_norm),
                "skipped_steps": int(self.engine.skipped_steps), "max_seq_len": stage.max_seq_len,
                "global_batch_size": stage.global_batch_size, "masked_tokens": int(global_masked),
                "tokens_per_s": global_tokens / seconds, "samples_per_s": samples / seconds,
                "step_time_s": seconds}

    @torch.no_grad()
    def validate(self, stage: ResolvedStage) -> None:
        if self.valid_batches is None:
            return
        start = time.perf_counter()
        self.engine.eval()
        sums = torch.zeros(3, dtype=torch.float64, device=self.engine.device)  # loss_sum, correct, masked
        # The same held-out batches every time (from the start of the valid stream), at this stage's shape.
        for batch in self.valid_batches.iter_eval_batches(stage.max_seq_len, stage.micro_batch_size,
                                                          max_batches=self.cfg.logging.valid_batches):
            out = self.engine(**self._to_device(batch))
            sums += torch.stack([out.loss_sum.double(), out.num_correct.double(), out.num_masked.double()])
        self.engine.train()
        dist.all_reduce(sums)
        loss, accuracy = (sums[0] / sums[2].clamp_min(1)).item(), (sums[1] / sums[2].clamp_min(1)).item()
        self.state.last_validation = {"step": self.state.step, "stage": stage.name, "max_seq_len": stage.max_seq_len,
                                      "loss": loss, "mlm_accuracy": accuracy}
        self.metrics.validation(self.state.step - 1, stage.index, loss, accuracy, time.perf_counter() - start)

    def save_checkpoint(self, stage: ResolvedStage) -> str:
        """All ranks write, barrier, then rank 0 marks it complete (sidecar) and moves `latest`."""
        start = time.perf_counter()
        root, tag = ckpt.checkpoints_dir(self.run_dir), ckpt.tag_for_step(self.state.step)
        directory = root / tag
        if self.rank == 0 and directory.exists():  # left by an interrupted run that got further
            ckpt.remove_checkpoint(directory)
        data_state = self.batches.state_dict()
        states = [None] * self.world_size
        # Also the sync point after rank 0's removal above: no rank writes into the directory before it.
        dist.all_gather_object(states, data_state)  # the data position is global: all ranks must agree
        if any(s != data_state for s in states):
            raise RuntimeError(f"data pipeline states differ between ranks at step {self.state.step}: {states}")
        _, in_stage = stage_for_step(self.stages, self.state.step - 1)
        sidecar = {"tag": tag, "step": self.state.step, "stage_index": stage.index, "stage_name": stage.name,
                   "step_in_stage": in_stage + 1, "stage_complete": self.state.step == stage.end_step,
                   **asdict(self.state), "data_state": data_state, "model_config": self.model_config,
                   "world_size": self.world_size, "loss_scale": loss_scale(self.engine),
                   "skipped_steps": int(self.engine.skipped_steps), "zero_stage": self.engine.zero_optimization_stage(),
                   "precision": precision(self.engine), "total_steps": self.total_steps}
        self.engine.save_checkpoint(str(root), tag=tag, client_state={"roformer_ds": sidecar}, save_latest=False)
        ckpt.save_rng(directory, self.rank)
        dist.barrier()
        if self.rank == 0:
            ckpt.write_sidecar(directory, sidecar)
            ckpt.publish_latest(self.run_dir, tag)
            ckpt.prune(self.run_dir, self.cfg.checkpoint.keep_last)
        dist.barrier()
        self.metrics.event("checkpoint", step=self.state.step, tag=tag, seconds=time.perf_counter() - start)
        return tag

    def stage_end_evals(self, stage: ResolvedStage, tag: str) -> None:
        """Optional hook (launcher/stage_evals.py) on rank 0 while the other ranks wait."""
        if self.cfg.logging.stage_end_evals and self.rank == 0:
            try:
                from launcher import stage_evals
            except ImportError:
                self.metrics.message("logging.stage_end_evals is set but launcher.stage_evals is not available")
            else:
                stage_evals.on_stage_end(self.run_dir, tag, stage, self.cfg)
        dist.barrier()

    def _to_device(self, batch: dict) -> dict:
        return {k: v.to(self.engine.device, non_blocking=True) for k, v in batch.items()}


def loss_scale(engine) -> float:
    """The dynamic fp16 loss scale (1.0 when there is none: fp32 / bf16)."""
    optimizer = engine.optimizer
    for path in ("loss_scale", "cur_scale", "loss_scale_config.cur_scale", "loss_scaler.cur_scale"):
        value = optimizer
        try:
            for attr in path.split("."):
                value = getattr(value, attr)
        except AttributeError:
            continue
        if isinstance(value, (int, float, torch.Tensor)):
            return float(value)
    return 1.0


def precision(engine) -> str:
    return "fp16" if engine.fp16_enabled() else "bf16" if engine.bfloat16_enabled() else "fp32"

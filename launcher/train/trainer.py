"""The per-rank training loop: stages switch inside one DeepSpeed engine, checkpoints are atomic.

Loss normalisation: an optimizer step sums token cross-entropies over all micro-batches of all
ranks and divides by the global number of masked tokens (all-reduced once per step). DeepSpeed
averages gradients over the data-parallel ranks, so each micro-batch's backward gets
loss_sum * world_size / global_masked, with DeepSpeed's own 1/grad-accum scaling switched off.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import deepspeed.comm as dist
import torch

from launcher.config.run_config import RunConfig
from launcher.config.stages import ResolvedStage, entry_at
from launcher.checkpoint.checkpointer import Checkpointer
from launcher.deepspeed_env.engine_state import loss_scale, min_loss_scale
from launcher.train.device_batches import host_counts, to_device
from launcher.train.guard_actions import GuardActions, Rewind, Stop
from launcher.train.heartbeats import HeartbeatWriter
from launcher.train.metrics import Metrics
from launcher.train.noise_probe import NoiseProbe
from launcher.train.read_ahead import ReadAhead
from launcher.common.mfu import step_model_flops
from roformer.rope import set_rope_theta

StageEndCallback = Callable[[str, ResolvedStage], None]
"""Called on rank 0 with (checkpoint tag, stage) after each stage-end checkpoint is complete."""


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

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            setattr(self, key, value)


@dataclass(frozen=True)
class DeviceBatches:
    """One optimizer step's micro-batches on the rank's device, with what the host counted before the copy."""

    micro: list[dict]
    masked: int
    """Masked tokens of this rank's micro-batches."""
    real: int
    """Non-padding tokens of this rank's micro-batches."""
    flops: float
    """Model FLOPs of this rank's micro-batches (launcher/common/mfu.py)."""


@dataclass(frozen=True)
class TrainerHooks:
    """What the loop calls out to besides its own parts."""

    on_stage_end: StageEndCallback | None = None
    heartbeats: HeartbeatWriter = field(default_factory=HeartbeatWriter.disabled)
    """Heartbeats for the hang watchdog (launcher/train/heartbeats.py)."""
    stop_requested: Callable[[], bool] = lambda: False
    """This rank got SIGTERM / SIGINT (launcher/train/stop_signals.py)."""


@dataclass(frozen=True)
class TrainParts:
    """A rank's built components the loop drives (launcher/train/rank.py build_components)."""

    engine: object
    """The DeepSpeed engine."""
    state: TrainState
    checkpointer: Checkpointer
    metrics: Metrics
    guard: GuardActions
    """The numerics guard (GuardActions.for_engine)."""
    noise: NoiseProbe = field(default_factory=NoiseProbe.disabled)
    """The gradient noise scale's measurement (logging.noise_every; NoiseProbe.for_engine)."""


class Trainer:
    def __init__(self, cfg: RunConfig, stages: list[ResolvedStage], batches: ReadAhead, valid_batches,
                 parts: TrainParts, hooks: TrainerHooks = TrainerHooks()):
        """batches: the training reader, read one step ahead (the checkpointer's data state is the same object);
        valid_batches: the validation reader."""
        self.cfg, self.stages, self.batches, self.valid_batches = cfg, stages, batches, valid_batches
        self.engine, self.state, self.checkpointer = parts.engine, parts.state, parts.checkpointer
        self.metrics, self.guard, self.noise = parts.metrics, parts.guard, parts.noise
        self.on_stage_end, self.heartbeats, self.stop_requested = hooks.on_stage_end, hooks.heartbeats, \
            hooks.stop_requested
        for reader in (batches, valid_batches):  # document_ids / position_ids in the batches (data.attention, positions)
            reader.set_document_view(cfg.data.document_view)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.stop_agreed = False  # some rank got a stop request (carried by the per-step all-reduce)
        self.guard_stop: Stop | None = None  # the numerics guard's decision that ended the run
        # The stage-switch message names the mask rate when some stage does not train at the run config's.
        self._per_stage_mask_prob = any(s.mask_prob != cfg.data.masking.mask_prob for s in stages)
        self._per_stage_view = len({s.document_view for s in stages}) > 1  # ... and attention / positions
        self.guard.restore(self.state.step)  # the guard of the uninterrupted run at this step, from the run's records

    def run(self) -> str:
        """Train to the end of the schedule ("finished"), until a stop signal ("stopped") or until the numerics
        guard stops the run ("guard_stopped": no checkpoint from the flagged steps)."""
        stage = None
        while self.state.step < self.cfg.schedule.total_steps:
            current = entry_at(self.stages, self.state.step)  # the stage, or its ramp's piece
            if current is not stage:
                with self.heartbeats.phase("stage switch", self.state.step):
                    stage = self.switch_to(current, previous=stage)
            decision = self.step(stage)
            if isinstance(decision, Stop):
                self.guard_stop = decision
                return "guard_stopped"
            if isinstance(decision, Rewind):  # an older checkpoint's step: its stage is set up afresh
                self.rewind(decision)
                stage = None
                continue
            stage_done = self.state.step == stage.stage_end_step  # a ramp's pieces end inside their stage
            if stage_done or _every(self.cfg.logging.valid_every, self.state.step):
                with self.heartbeats.phase("validation", self.state.step):
                    self.validate(stage)
            if stage_done or self.stop_agreed or _every(self.cfg.checkpoint.every_steps, self.state.step):
                if self.guard.flagged:  # never a resume point from a step the guard flagged
                    self.skip_checkpoint(stage_done)
                    stage_done = False
                else:
                    with self.heartbeats.phase("checkpoint save", self.state.step):
                        tag = self.save_checkpoint(stage)
                if stage_done:
                    with self.heartbeats.phase("stage end", self.state.step):
                        self.stage_end(stage, tag)
            if self.stop_agreed and self.state.step < self.cfg.schedule.total_steps:
                return "stopped"
        return "finished"

    def step(self, stage: ResolvedStage) -> Rewind | Stop | None:
        """One optimizer step of `stage` with its heartbeat, its train record and the numerics guard's decision
        on it (launcher/train/guard_actions.py)."""
        skipped_before = int(self.engine.skipped_steps)
        with self.heartbeats.step(self.state.step, stage.index):
            record = self.train_step(stage)
            self.metrics.train_step(dict(record))
        self.state.step += 1
        return self.guard.after_step(record, skipped_before)

    def rewind(self, decision: Rewind) -> None:
        """The guard's rewind, in the running processes: the checkpoint's weights, optimizer, scaler, counters,
        data position and RNG, then the skip in the data position."""
        point = decision.point
        with self.heartbeats.phase("guard rewind", self.state.step):  # the hang watchdog bounds the reload
            self.checkpointer.load(point, self.cfg.seed)
            min_loss_scale(self.engine, guard_on=True)  # the loaded scaler, too, leaves the floor to the guard
            stage = entry_at(self.stages, point.step)
            self.batches.skip(stage.max_seq_len, decision.skip_batches * stage.global_batch_size)
            self.metrics.rewind(point.step)  # train records past the checkpoint belong to the abandoned future
            self.guard.rewound(decision)

    def switch_to(self, stage: ResolvedStage, previous: ResolvedStage | None = None) -> ResolvedStage:
        """New length and batch for the running engine (no rebuild): micro-batch, then grad-accum. `stage` is a
        stage, or the next piece of the batch ramp of `previous` (the entry trained so far: the engine's batch only)."""
        start = time.perf_counter()
        ramp_step = previous is not None and previous.index == stage.index  # the ramp's next batch, not a new stage
        self.engine.set_train_micro_batch_size(stage.micro_batch_size)
        self.engine.set_train_batch_size(stage.global_batch_size)
        assert self.engine.gradient_accumulation_steps() == stage.grad_accum_steps
        if ramp_step:
            self._say_ramp_step(stage, previous, time.perf_counter() - start)
            return stage
        if stage.rope_theta is not None:  # per-stage RoPE base (context extension): same weights, new table
            set_rope_theta(self.engine.module, stage.rope_theta)
        # The training stream only: validation keeps the run config's rate, so its losses compare across stages.
        self.batches.set_mask_prob(stage.mask_prob)
        self.batches.set_mixture(stage.mixture)  # None: the sources in proportion to their size
        for reader in (self.batches, self.valid_batches):  # the stage's attention / positions (validation too)
            reader.set_document_view(stage.document_view)
        self.metrics.event("stage_start", step=self.state.step, stage=stage.index, name=stage.name,
                           max_seq_len=stage.max_seq_len, global_batch_size=stage.global_batch_size,
                           micro_batch_size=stage.micro_batch_size, grad_accum_steps=stage.grad_accum_steps,
                           rope_theta=stage.rope_theta, mask_prob=stage.mask_prob, mixture=stage.mixture_dict,
                           attention=stage.attention, positions=stage.positions, seconds=time.perf_counter() - start)
        self.metrics.message(f"stage {stage.index + 1}/{self.stages[-1].index + 1} '{stage.name}' after step "
                             f"{self.state.step} (steps {self.state.step + 1}-{stage.stage_end_step}): max_seq_len "
                             f"{stage.max_seq_len}, "
                             f"global batch {stage.global_batch_size} = {stage.micro_batch_size} x "
                             f"{stage.grad_accum_steps} x {self.world_size}"
                             + ("" if stage.pieces == 1 else f" (batch ramp {stage.piece + 1}/{stage.pieces})")
                             + ("" if stage.rope_theta is None else f", rope_theta {stage.rope_theta:g}")
                             + (f", mask_prob {stage.mask_prob:g}" if self._per_stage_mask_prob else "")
                             + (f", attention {stage.attention}, positions {stage.positions}"
                                if self._per_stage_view else "")
                             + ("" if stage.mixture is None else ", mixture " + ", ".join(
                                 f"{source} {share:.3g}" for source, share in stage.mixture)))
        return stage

    def _say_ramp_step(self, stage: ResolvedStage, previous: ResolvedStage, seconds: float) -> None:
        """The `batch_ramp` event and console line of a ramp's next batch."""
        self.metrics.event("batch_ramp", step=self.state.step, stage=stage.index, name=stage.name, piece=stage.piece,
                           pieces=stage.pieces, global_batch_size=stage.global_batch_size,
                           micro_batch_size=stage.micro_batch_size, grad_accum_steps=stage.grad_accum_steps,
                           seconds=seconds)
        self.metrics.message(f"stage '{stage.name}' batch {previous.global_batch_size} -> {stage.global_batch_size} "
                             f"after step {self.state.step} (ramp {stage.piece + 1}/{stage.pieces}, steps "
                             f"{self.state.step + 1}-{stage.end_step}): {stage.micro_batch_size} x "
                             f"{stage.grad_accum_steps} x {self.world_size}")

    def train_step(self, stage: ResolvedStage) -> dict:
        start = time.perf_counter()
        lr = self.cfg.learning_rate(self.state.step, stage.lr_scale)
        for group in self.engine.optimizer.param_groups:
            group["lr"] = lr
        # Read ahead during the previous step where it trained the same shape (launcher/train/read_ahead.py).
        read = self.batches.step_batches(stage.max_seq_len, stage.micro_batch_size, stage.grad_accum_steps,
                                         self._prepare)
        batches, tokens_by_source = read.prepared, read.tokens_by_source  # tokens by source: all ranks
        # One all-reduce before the forward: masked tokens (the loss denominator), real tokens, stop flag, model
        # FLOPs (for the per-rank mean TFLOP/s and MFU). Read back with the step's sums: the device is read once
        # per step, and the denominator stays on the device (the same fp32 value as a host float would give).
        counts = torch.tensor([batches.masked, batches.real, float(self.stop_requested()), batches.flops],
                              dtype=torch.float64, device=self.engine.device)
        dist.all_reduce(counts)
        scale = (self.world_size / counts[0].clamp_min(1.0)).float()
        noise = self.noise.measure(self.state.step, batches.micro)  # every logging.noise_every steps, else {}
        sums = torch.zeros(2, dtype=torch.float64, device=self.engine.device)  # loss_sum, correct
        for i, batch in enumerate(batches.micro):
            self.engine.set_gradient_accumulation_boundary(i == len(batches.micro) - 1)
            out = self.engine(**batch)
            self.engine.backward(out.loss_sum * scale, scale_wrt_gas=False)
            self.engine.step()
            sums += torch.stack([out.loss_sum.detach().double(), out.num_correct.double()])
        dist.all_reduce(sums)
        self._read_ahead(stage)  # the host reads the next step while the device runs this one
        # The step's one device read; it waits for the step's kernels, so the clock is read after them.
        global_masked, global_tokens, stops, global_flops, loss_sum, correct = torch.cat([counts, sums]).tolist()
        self.stop_agreed = stops > 0
        seconds = time.perf_counter() - start
        samples = stage.global_batch_size
        self.state.consumed_samples += samples
        self.state.consumed_tokens += int(global_tokens)
        grad_norm = self.engine.get_global_grad_norm()
        # "step" counts steps completed, this one included (launcher/run_dir/metrics_format.py).
        return {"step": self.state.step + 1, "stage": stage.index, "loss": loss_sum / max(global_masked, 1.0),
                "mlm_accuracy": correct / max(global_masked, 1.0), "lr": lr,
                "loss_scale": loss_scale(self.engine), "grad_norm": None if grad_norm is None else float(grad_norm),
                "skipped_steps": int(self.engine.skipped_steps), "max_seq_len": stage.max_seq_len,
                "global_batch_size": stage.global_batch_size, "masked_tokens": int(global_masked),
                "tokens_per_s": global_tokens / seconds, "samples_per_s": samples / seconds,
                "step_time_s": seconds, "model_flops_per_rank": global_flops / self.world_size,
                "tokens_by_source": tokens_by_source, "consumed_tokens": self.state.consumed_tokens,
                "schedule_tokens": self.cfg.schedule.tokens_before(self.state.step + 1), **noise}

    @torch.no_grad()
    def validate(self, stage: ResolvedStage) -> None:
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
        self.metrics.validation(self.state.step, stage.index, loss, accuracy, time.perf_counter() - start)

    def save_checkpoint(self, stage: ResolvedStage) -> str:
        start = time.perf_counter()
        tag = self.checkpointer.save(stage, protect_steps=self.guard.protect_steps(self.state.step))
        self.metrics.event("checkpoint", step=self.state.step, tag=tag, seconds=time.perf_counter() - start)
        return tag

    def skip_checkpoint(self, stage_done: bool) -> None:
        """The checkpoint due at this step is not written: the guard flagged the step (an open spike)."""
        began = self.guard.began
        self.metrics.event("checkpoint_skipped", step=self.state.step, guard_flagged_since=began)
        self.metrics.message(f"checkpoint at step {self.state.step} not written: the numerics guard flagged the "
                             f"steps since {began}" + (" (and the stage-end jobs with it)" if stage_done else ""))

    def stage_end(self, stage: ResolvedStage, tag: str) -> None:
        """The stage-end callback on rank 0 while the other ranks wait."""
        if self.on_stage_end is not None and self.rank == 0:
            self.on_stage_end(tag, stage)
        dist.barrier()

    def _to_device(self, batch: dict) -> dict:
        return to_device(batch, self.engine.device)

    def _prepare(self, host: list[dict]) -> DeviceBatches:
        """A step's host micro-batches counted on the host, then copied (device_batches.py: no device sync)."""
        masked, real = zip(*(host_counts(b) for b in host))
        flops = step_model_flops(self.cfg.model, [(*b["input_ids"].shape, m) for b, m in zip(host, masked)])
        return DeviceBatches([self._to_device(b) for b in host], sum(masked), sum(real), flops)

    def _read_ahead(self, stage: ResolvedStage) -> None:
        """The next step's batches, when it trains this stage (or ramp piece) with nothing in between that moves
        the reader; a checkpoint at this step still records the reader before them (ReadAhead.state_dict)."""
        step = self.state.step + 1
        if step < self.cfg.schedule.total_steps and entry_at(self.stages, step) is stage:
            self.batches.read_ahead(stage.max_seq_len, stage.micro_batch_size, stage.grad_accum_steps, self._prepare)


def _every(interval: int, step: int) -> bool:
    """True every `interval` steps (never when interval is 0)."""
    return bool(interval) and step % interval == 0

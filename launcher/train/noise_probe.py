"""The trainer's gradient-noise measurement (logging.noise_every): every N steps, before the step trains, a
measurement pass on the step's own first micro-batch with the same parameters. The estimator (the math and its
EMA state, checkpointed in the sidecar): launcher/train/noise_scale.py.

Why a pass of its own: DeepSpeed reduces (ZeRO-0) or reduces and partitions (ZeRO-1/2) the gradients inside
its backward, so no rank ever holds its own un-reduced gradient. torch.autograd.grad on the module's parameters
fires none of the engine's gradient hooks and leaves .grad alone, so the training step is exactly what it is
without the probe (the random generators are put back too: dropout draws the same masks). The pieces:
  world size >= 2: one micro-batch per rank; B_small = the micro-batch, B_big = micro-batch x world size;
  world size 1:    the micro-batch's two halves (B_small = half, B_big = the micro-batch), or, with one
                   sequence per micro-batch, the step's first two micro-batches.
ZeRO-3 partitions the parameters themselves: no estimate (one line at the start), measured nowhere yet.
"""
from __future__ import annotations

import torch
from deepspeed.accelerator import get_accelerator

from launcher.deepspeed_env.engine_state import loss_scale
from launcher.train.noise_scale import NoiseEstimator, squared_norms


class NoiseProbe:
    """Measures on the steps `due` says; `measure` returns the train record's noise fields ({} on other steps)."""

    def __init__(self, every: int, engine=None, world_size: int = 1, note: str | None = None):
        """every: logging.noise_every (0 = off); note: why it measures nothing though asked to (said by `attach`)."""
        self.every, self.engine, self.world_size, self.note = every, engine, world_size, note
        self.say = lambda text: None
        self.estimator = NoiseEstimator()
        self._said_no_pieces = False

    def attach(self, say) -> None:
        """Console lines from now on go to `say` (rank 0's Metrics.message); the note, if any, first."""
        self.say = say
        if self.note:
            say(self.note)

    @classmethod
    def disabled(cls) -> "NoiseProbe":
        return cls(0)

    @classmethod
    def for_engine(cls, every: int, engine, zero_stage: int, world_size: int) -> "NoiseProbe":
        if every and zero_stage == 3:
            return cls(0, note=f"logging.noise_every {every}: no gradient noise scale under ZeRO-3 (the parameters "
                               "are partitioned); ZeRO 0-2 measure it")
        return cls(every, engine, world_size)

    def due(self, step: int) -> bool:
        """Measure before step index `step` (0-based): its record is step + 1, a multiple of noise_every."""
        return bool(self.every) and (step + 1) % self.every == 0

    def measure(self, step: int, micro: list[dict]) -> dict:
        if not self.due(step):
            return {}
        pieces, b_small = self._pieces(micro)
        if not pieces:
            return {}
        small_sq, big_sq, count = squared_norms([self._gradient(piece) for piece in pieces])
        if not (torch.isfinite(torch.tensor([small_sq, big_sq])).all()):  # an fp16 overflow: no measurement
            return {}
        estimate = self.estimator.update(small_sq, big_sq, b_small, b_small * count)
        return {} if estimate is None else estimate.record()

    def state_dict(self) -> dict:
        return self.estimator.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.estimator.load_state_dict(state)

    def _pieces(self, micro: list[dict]) -> tuple[list[dict], int]:
        """The batches measured on this rank and the sequences in each (all the same size)."""
        rows = len(micro[0]["input_ids"])
        if self.world_size > 1:
            return [micro[0]], rows
        if rows >= 2:
            half = rows // 2
            return [_rows(micro[0], 0, half), _rows(micro[0], half, 2 * half)], half
        if len(micro) >= 2:
            return micro[:2], rows
        if not self._said_no_pieces:
            self._said_no_pieces = True
            self.say("logging.noise_every: no gradient noise scale at one sequence per step on one rank")
        return [], 0

    def _gradient(self, batch: dict) -> list[torch.Tensor]:
        """d(mean masked-token loss of `batch`)/d(parameters) in fp32, the generators as they were before."""
        module = self.engine.module
        params = [p for p in module.parameters() if p.requires_grad]
        scale = loss_scale(self.engine)  # fp16: the engine's scale keeps small gradients from underflowing
        accelerator = get_accelerator()
        cpu_state, device_state = torch.get_rng_state(), accelerator.get_rng_state()
        try:
            out = module(**batch)
            loss = out.loss_sum.float() / out.num_masked.float().clamp_min(1.0)
            grads = torch.autograd.grad(loss * scale, params, allow_unused=True)
        finally:
            torch.set_rng_state(cpu_state)
            accelerator.set_rng_state(device_state)
        unscale = 1.0 / scale
        return [torch.zeros_like(p, dtype=torch.float32) if g is None else g.float() * unscale if scale != 1.0
                else g.float() for p, g in zip(params, grads)]


def _rows(batch: dict, start: int, end: int) -> dict:
    """Sequences start..end of a micro-batch (tensors with a batch dimension; other entries as they are). The
    whole batch's document offsets `cu_seqlens` are left out: the model reads the documents off document_ids."""
    rows = len(batch["input_ids"])
    return {k: v[start:end] if torch.is_tensor(v) and v.dim() and len(v) == rows else v for k, v in batch.items()
            if k != "cu_seqlens"}

"""Memory and time of each stage per rank, from the configs alone (what `roformer plan` prints).

Memory per rank = model states + communication buckets + the larger of the activations and the
optimizer step's temporaries (the activations are freed by the time the optimizer steps) + a fixed
runtime allowance.
- Model states (weights, gradients, AdamW moments, fp32 master copy) come from DeepSpeed's own
  estimators (deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs and
  stage3.estimate_zero3_model_states_mem_needs). They assume 16-bit training (2 bytes of weights
  + 18/N bytes of the rest per parameter, N ranks). ZeRO-1 (no estimator in DeepSpeed) keeps the
  16-bit gradients whole: ZeRO-2's figure + 2 (1 - 1/N) bytes per parameter. ZeRO-0: 2 + 2 + 16.
  fp32 training keeps 4-byte weights and 4-byte gradients: + 2 bytes + 2/N (2 for ZeRO-0/1) per
  parameter over the 16-bit figure.
- Activations saved for backward per layer at micro-batch b, length s, hidden h, intermediate I,
  heads a (elements of the compute dtype, plus 1-byte dropout masks), after Korthikanti et al. 2022
  ("Reducing activation recomputation"), written for our I instead of 4h, with the attention
  scores as our kernels keep them:
      8 s b h + 2 s b I        elements
      2 s b h                  bytes of hidden dropout masks (only when dropout > 0)
      a s^2 b                  bytes: on CPU ranks, the attention-dropout keep mask of
                               roformer/cpu_kernels/attention.py (probabilities recomputed in backward)
      4 a s b                  bytes: on accelerators, SDPA's fused kernels (flash / memory-efficient,
                               dropout included) keep one float per query row and no score
  (Korthikanti's math path would add 2 a s^2 b elements + a s^2 b bytes: softmax output, its
  dropout and mask; none of our paths materialises them). Plus the embeddings' output and the MLM
  head at the expected masked positions (logits in fp32). With activation checkpointing only each
  layer's input is kept, plus one layer's full activations while it is recomputed.
- Optimizer step: torch's AdamW (`torch_adam` in the DeepSpeed config; foreach) allocates two
  temporaries of the rank's fp32 partition while it steps: 8 bytes per parameter of the partition.
  DeepSpeed's fused GPU / CPU Adam kernels update in place (0).
- Buckets: ZeRO-1/2 allocate reduce_bucket_size elements (twice with overlap_comm) of 16-bit (4-byte
  in fp32) gradients.
Time per step = FLOPs executed (roformer.flops.hardware_training_flops: model FLOPs plus the forward
recomputed by checkpointing) / (peak x MFU): the MFU measured for the device and precision where the project has
a measurement (launcher/common/mfu.py MEASURED_MFU), else assumed (ASSUMED_MFU), or --mfu.

Pure functions of the configs; DeepSpeed's estimators are imported when first called.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from launcher.common.mfu import PlanMfu
from launcher.config.hardware_section import parse_memory
from roformer import RoFormerConfig
from roformer.flops import hardware_training_flops, parameter_count

if TYPE_CHECKING:
    from launcher.config.deepspeed_json import DeepSpeedJson

GIB = 2 ** 30
# Memory that is not the model's. On a GPU the CUDA context and allocator slack (0.3-0.8 GB). On a
# CPU rank the interpreter, torch, DeepSpeed, the data readers and the process group: 0.25 GiB
# resident before the model exists, measured on this project's ranks (bench/results/memory.json),
# plus what is imported later (TensorBoard).
RUNTIME_ALLOWANCE_BYTES = int(0.75 * GIB)
CPU_RUNTIME_ALLOWANCE_BYTES = int(0.3 * GIB)
EXPECTED_MASK_RATE = 0.15


@dataclass(frozen=True)
class TrainingSetup:
    """What the memory depends on besides the stage's shape: read from the run and DeepSpeed configs."""

    model: RoFormerConfig
    world_size: int
    zero_stage: int
    precision: str
    """fp16, bf16 or fp32 (the DeepSpeed config's)."""
    offload_optimizer: bool
    reduce_bucket_elements: int
    overlap_comm: bool
    activation_checkpointing: bool
    cpu_ranks: bool = False
    """The ranks compute on CPUs (our block-wise attention keeps a 1-byte dropout mask per score; the
    runtime allowance is a CPU process's), not on an accelerator (SDPA's fused kernels)."""
    torch_optimizer: bool = False
    """DeepSpeed runs torch's AdamW (`torch_adam`), whose step allocates temporaries."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per rank of one stage."""

    model_states: int
    activations: int
    activations_checkpointed: int
    buckets: int
    optimizer_step: int
    """Temporaries of the optimizer step (after backward: they never coexist with the activations)."""
    runtime: int
    checkpointing: bool
    """Whether the total uses the checkpointed activations."""

    @property
    def active_activations(self) -> int:
        """The activations of the run's setting (checkpointed or not)."""
        return self.activations_checkpointed if self.checkpointing else self.activations

    @property
    def model_dependent(self) -> int:
        """Everything but the fixed runtime allowance: what grows with the model and the micro-batch."""
        return self.model_states + self.buckets + max(self.active_activations, self.optimizer_step)

    @property
    def total(self) -> int:
        return self.model_dependent + self.runtime


def format_bytes(count: float) -> str:
    return f"{count / GIB:.2f} GiB"


def largest_layer_params(model: RoFormerConfig) -> int:
    """The biggest single module's parameters (ZeRO-3 gathers one at a time): the word embeddings or one
    feed-forward matrix."""
    return max(model.vocab_size * model.embedding_size, model.hidden_size * model.intermediate_size)


def model_state_bytes(setup: TrainingSetup) -> int:
    """Per-rank model states from DeepSpeed's estimators (see the module docstring for ZeRO-0/1, fp32)."""
    params = parameter_count(setup.model)
    n = setup.world_size  # the device figures depend on the total rank count only
    if setup.zero_stage == 3:
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

        _, device, _ = estimate_zero3_model_states_mem_needs(
            params, largest_layer_params(setup.model), num_gpus_per_node=n, num_nodes=1, cpu_offload=setup.offload_optimizer, cpu_offload_params=False)
    else:
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

        _, device = estimate_zero2_model_states_mem_needs(params, num_gpus_per_node=n, num_nodes=1,
                                                          cpu_offload=setup.offload_optimizer)
        if setup.zero_stage == 1:
            device += int(2 * params * (1 - 1 / n))
        elif setup.zero_stage == 0:
            device = 20 * params
    if setup.precision == "fp32":
        whole_grads = setup.zero_stage <= 1
        device += 2 * params + (2 * params if whole_grads else int(2 * params / n))
    return int(device)


def activation_bytes(model: RoFormerConfig, micro_batch: int, seq_len: int, precision: str,
                     checkpointing: bool, cpu_ranks: bool = False) -> int:
    """Activations saved for backward by one micro-batch (see the module docstring)."""
    element = 4 if precision == "fp32" else 2
    b, s, h, inner, heads = micro_batch, seq_len, model.hidden_size, model.intermediate_size, model.num_attention_heads
    hidden_drop = model.hidden_dropout_prob > 0
    attention_drop = model.attention_probs_dropout_prob > 0
    keep_mask = cpu_ranks and attention_drop
    layer = element * (8 * s * b * h + 2 * s * b * inner) + (2 * s * b * h if hidden_drop else 0)
    layer += heads * s * s * b if keep_mask else 4 * heads * s * b
    masked = EXPECTED_MASK_RATE * b * s
    outside = element * s * b * (model.embedding_size + h) + masked * (element * 2 * model.embedding_size
                                                                      + 4 * 2 * model.vocab_size)
    if checkpointing:
        return int(model.num_hidden_layers * element * s * b * h + layer + outside)
    return int(model.num_hidden_layers * layer + outside)


def bucket_bytes(setup: TrainingSetup) -> int:
    if setup.zero_stage not in (1, 2):
        return 0
    element = 4 if setup.precision == "fp32" else 2
    elements = min(setup.reduce_bucket_elements, parameter_count(setup.model))
    return element * elements * (2 if setup.overlap_comm else 1)


def optimizer_step_bytes(setup: TrainingSetup) -> int:
    """Temporaries of torch's AdamW step: two fp32 copies of the rank's partition (see the module docstring)."""
    if not setup.torch_optimizer:
        return 0
    params = parameter_count(setup.model)
    return 8 * (params if setup.zero_stage == 0 else -(-params // setup.world_size))


def estimate_memory(setup: TrainingSetup, micro_batch: int, seq_len: int) -> MemoryEstimate:
    def activations(checkpointing: bool) -> int:
        return activation_bytes(setup.model, micro_batch, seq_len, setup.precision, checkpointing, setup.cpu_ranks)

    return MemoryEstimate(
        model_states=model_state_bytes(setup), activations=activations(False),
        activations_checkpointed=activations(True), buckets=bucket_bytes(setup),
        optimizer_step=optimizer_step_bytes(setup),
        runtime=CPU_RUNTIME_ALLOWANCE_BYTES if setup.cpu_ranks else RUNTIME_ALLOWANCE_BYTES,
        checkpointing=setup.activation_checkpointing)


def largest_fitting_micro_batch(setup: TrainingSetup, seq_len: int, device_bytes: int, checkpointing: bool,
                                limit: int = 4096) -> int:
    """The largest micro-batch whose estimate fits device_bytes (0: not even one sequence)."""
    def fits(b: int) -> bool:
        return replace(estimate_memory(setup, b, seq_len), checkpointing=checkpointing).total <= device_bytes

    if not fits(1):
        return 0
    low, high = 1, limit
    while low < high:  # activations grow with b: bisect
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low


def step_seconds(model: RoFormerConfig, micro_batch: int, grad_accum_steps: int, seq_len: int,
                 checkpointing: bool, peak_tflops: float, mfu: float) -> float:
    """Seconds of one optimizer step per rank at an assumed MFU of the peak."""
    flops = grad_accum_steps * hardware_training_flops(model, micro_batch, seq_len,
                                                       EXPECTED_MASK_RATE * micro_batch * seq_len, checkpointing)
    return flops / (peak_tflops * 1e12 * mfu)


def format_duration(seconds: float) -> str:
    hours, rest = divmod(int(seconds), 3600)
    days, hours = divmod(hours, 24)
    return (f"{days}d " if days else "") + f"{hours:d}:{rest // 60:02d}:{rest % 60:02d}"


def setup_from_configs(model: RoFormerConfig, ds_json: DeepSpeedJson, world_size: int, activation_checkpointing: bool,
                       cpu_ranks: bool) -> TrainingSetup:
    """The TrainingSetup of a run config's model and its DeepSpeed JSON as parsed once (DeepSpeedJson: its precision
    and ZeRO stage are read there; buckets, offload and optimizer from its config, the same in every stage's),
    on CPU ranks or not."""
    ds_config = ds_json.config
    zero = ds_config.get("zero_optimization") or {}
    offload = (zero.get("offload_optimizer") or {}).get("device", "none") not in ("none", None)
    return TrainingSetup(model=model, world_size=world_size, zero_stage=ds_json.zero_stage,
                         precision=ds_json.precision, offload_optimizer=offload,
                         reduce_bucket_elements=int(zero.get("reduce_bucket_size", 5e8)),
                         overlap_comm=bool(zero.get("overlap_comm", False)),
                         activation_checkpointing=activation_checkpointing, cpu_ranks=cpu_ranks,
                         torch_optimizer=bool(ds_config.get("optimizer", {}).get("params", {}).get("torch_adam")))


@dataclass(frozen=True)
class StageEstimate:
    """What `roformer plan` says about one stage per rank (printed as a table row, or as JSON)."""

    name: str
    micro_batch_size: int
    max_seq_len: int
    memory: MemoryEstimate
    fits: bool
    """memory.total <= the device memory."""
    largest_micro_batch: int
    """The largest micro-batch that fits without activation checkpointing (0: not one sequence)."""
    largest_micro_batch_checkpointed: int
    """The same with activation checkpointing."""
    seconds: float
    """The stage's steps at the assumed MFU."""

    @property
    def verdict(self) -> str:
        return "FITS" if self.fits else "DOES NOT FIT"

    def to_dict(self) -> dict:
        memory = self.memory
        return {"name": self.name, "micro_batch_size": self.micro_batch_size, "max_seq_len": self.max_seq_len,
                "memory_bytes": {"model_states": memory.model_states, "activations": memory.activations,
                                 "activations_checkpointed": memory.activations_checkpointed,
                                 "buckets": memory.buckets, "optimizer_step": memory.optimizer_step,
                                 "runtime": memory.runtime, "total": memory.total},
                "activation_checkpointing": memory.checkpointing, "fits": self.fits,
                "verdict": self.verdict, "largest_micro_batch": self.largest_micro_batch,
                "largest_micro_batch_checkpointed": self.largest_micro_batch_checkpointed, "seconds": self.seconds}


def estimate_stages(stages, setup: TrainingSetup, device_bytes: int, peak_tflops: float,
                    mfu: PlanMfu | float) -> list[StageEstimate]:
    """Memory, verdict, largest micro-batches and time of each stage (ResolvedStage) per rank; the MFU at each
    stage's length (launcher/common/mfu.py PlanMfu: measured where the project has a measurement)."""
    estimates = []
    for stage in stages:
        memory = estimate_memory(setup, stage.micro_batch_size, stage.max_seq_len)
        seconds = stage.steps * step_seconds(setup.model, stage.micro_batch_size, stage.grad_accum_steps,
                                             stage.max_seq_len, setup.activation_checkpointing, peak_tflops,
                                             mfu.at(stage.max_seq_len) if isinstance(mfu, PlanMfu) else mfu)
        estimates.append(StageEstimate(
            name=_row_name(stage), micro_batch_size=stage.micro_batch_size, max_seq_len=stage.max_seq_len, memory=memory,
            fits=memory.total <= device_bytes,
            largest_micro_batch=largest_fitting_micro_batch(setup, stage.max_seq_len, device_bytes, False),
            largest_micro_batch_checkpointed=largest_fitting_micro_batch(setup, stage.max_seq_len, device_bytes,
                                                                         True),
            seconds=seconds))
    return estimates


def _row_name(stage) -> str:
    """The stage's name; a batch ramp's piece as 'NAME k/N' (each piece has its own batch, so its own row)."""
    return stage.name if stage.pieces == 1 else f"{stage.name[:10]} {stage.piece + 1}/{stage.pieces}"


def format_estimates(estimates: list[StageEstimate], setup: TrainingSetup, device_bytes: int, peak_tflops: float,
                     peak_source: str, mfu: PlanMfu | float) -> str:
    """The memory / time table of `roformer plan`."""
    lines = [f"memory per rank (ZeRO-{setup.zero_stage}, {setup.precision}, {setup.world_size} ranks, device "
             f"{format_bytes(device_bytes)}; activation checkpointing "
             f"{'on' if setup.activation_checkpointing else 'off'} (schedule.activation_checkpointing) for FITS; "
             f"{'CPU ranks' if setup.cpu_ranks else 'accelerator ranks: fused attention kernels'}):",
             f"  {'stage':<16}{'micro x len':>13}{'model states':>14}{'activations':>13}{'(ckpt)':>11}"
             f"{'total':>12}  {'verdict':<13}{'max micro':>10}{'(ckpt)':>8}{'time':>14}"]
    for stage in estimates:
        memory = stage.memory
        lines.append(f"  {stage.name:<16}{f'{stage.micro_batch_size} x {stage.max_seq_len}':>13}"
                     f"{format_bytes(memory.model_states):>14}{format_bytes(memory.activations):>13}"
                     f"{format_bytes(memory.activations_checkpointed):>11}{format_bytes(memory.total):>12}  "
                     f"{stage.verdict:<13}{stage.largest_micro_batch:>10}"
                     f"{stage.largest_micro_batch_checkpointed:>8}{format_duration(stage.seconds):>14}")
    if estimates:
        memory = estimates[-1].memory
        lines.append(f"  (totals include {format_bytes(memory.buckets)} of gradient buckets, "
                     f"{format_bytes(memory.runtime)} runtime allowance, and the optimizer step's "
                     f"{format_bytes(memory.optimizer_step)} of temporaries where they exceed the activations)")
    lines.append(f"time: {format_duration(sum(stage.seconds for stage in estimates))} for the whole schedule at "
                 f"{mfu.label if isinstance(mfu, PlanMfu) else f'{100 * mfu:.0f}% MFU'} of {peak_tflops:.4g} TFLOP/s "
                 f"per rank ({peak_source})")
    return "\n".join(lines)


__all__ = ["setup_from_configs", "estimate_stages", "format_estimates", "StageEstimate", "TrainingSetup", "MemoryEstimate", "parse_memory", "format_bytes", "model_state_bytes",
           "activation_bytes", "bucket_bytes", "optimizer_step_bytes", "estimate_memory", "largest_fitting_micro_batch", "step_seconds",
           "format_duration", "RUNTIME_ALLOWANCE_BYTES", "CPU_RUNTIME_ALLOWANCE_BYTES"]

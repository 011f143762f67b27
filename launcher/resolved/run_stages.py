"""The run's stages at a world size (`stages_at`: the one per-stage resolution the ranks, `roformer plan` and
`roformer pretrain`'s launch plan share), and the device `micro_batch_size: auto` sizes against (launcher/config/stages.py MicroBatchTarget), with this run's
memory plan (launcher/pricing/estimate.py):

1. the run config's `hardware.device` when declared: the same on the launching machine (`roformer plan`,
   `pretrain --dry-run`) and on every rank, so they agree by construction;
2. otherwise the accelerator of the machine resolving it (a rank's own: DeepSpeed's get_accelerator(), its
   total_memory()); a CPU has none: the stage falls back to schedule.max_tokens_per_micro_batch's rule.

Returns None when no stage says auto (nothing is read then). `stages_at` resolves the stages with it: the one
resolution the ranks, `roformer plan` and `roformer pretrain`'s launch plan share.
"""
from __future__ import annotations

from dataclasses import dataclass

from launcher.config.deepspeed_json import DeepSpeedJson
from launcher.config.run_config import RunConfig
from launcher.config.schedule import AUTO_MICRO
from launcher.config.stages import MicroBatchTarget, ResolvedStage, resolve_stages
from launcher.pricing.estimate import TrainingSetup, estimate_memory, largest_fitting_micro_batch, setup_from_configs


@dataclass(frozen=True)
class SetupPlan:
    """MemoryPlan (launcher/config/stages.py) of one TrainingSetup, at the run's activation checkpointing."""

    setup: TrainingSetup

    def largest_micro_batch(self, seq_len: int, budget_bytes: int) -> int:
        return largest_fitting_micro_batch(self.setup, seq_len, budget_bytes, self.setup.activation_checkpointing)

    def planned_bytes(self, micro_batch: int, seq_len: int) -> int:
        return estimate_memory(self.setup, micro_batch, seq_len).total


def stages_at(cfg: RunConfig, world_size: int, ds_json: DeepSpeedJson) -> list[ResolvedStage]:
    """Every stage of the schedule at `world_size` ranks, `micro_batch_size: auto` sized against
    micro_batch_target; UserError (one line) when the schedule does not fit."""
    target = micro_batch_target(cfg, world_size, ds_json)
    return resolve_stages(cfg, world_size, target)


def micro_batch_target(cfg: RunConfig, world_size: int, ds_json: DeepSpeedJson) -> MicroBatchTarget | None:
    """The target of `micro_batch_size: auto` (see the module docstring); None when no stage says auto.
    ds_json: the run's DeepSpeed JSON as the caller read it (launcher/config/deepspeed_json.py DeepSpeedJson)."""
    if not any(stage.micro_batch_size == AUTO_MICRO for stage in cfg.schedule.stages):
        return None
    if cfg.hardware.device:
        label = f"{cfg.hardware.memory_bytes / 2 ** 30:.0f} GiB {cfg.hardware.name} (hardware.device)"
        return declared_target(cfg, world_size, label, cfg.hardware.memory_bytes, ds_json)
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    kind = accelerator.device_name()
    if kind == "cpu":
        return MicroBatchTarget(f"this machine: {kind}")
    memory = int(accelerator.total_memory())
    return declared_target(cfg, world_size, f"{memory / 2 ** 30:.0f} GiB {kind} (this machine)", memory, ds_json)


def declared_target(cfg: RunConfig, world_size: int, label: str, device_bytes: int,
                    ds_json: DeepSpeedJson) -> MicroBatchTarget:
    """A target of `device_bytes` per accelerator rank, planned with the run's model and DeepSpeed JSON (its ZeRO
    stage, precision, buckets and optimizer: none of them depends on the micro-batch)."""
    setup = setup_from_configs(cfg.model, ds_json, world_size, cfg.schedule.activation_checkpointing,
                               cpu_ranks=False)
    return MicroBatchTarget(label, device_bytes, SetupPlan(setup))


__all__ = ["SetupPlan", "stages_at", "micro_batch_target", "declared_target"]

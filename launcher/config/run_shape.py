"""The shape of a run: how DeepSpeed partitions and types its checkpoint files. One definition: the running one
is resolved with the DeepSpeed configs (launcher/resolved/stage_configs.py resolve_stage_configs, kept in the rank's
setup), a checkpoint's is read from its sidecar (resume, the numerics guard's rewind). Pure Python: the plan reads
it without DeepSpeed.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunShape:
    """How DeepSpeed partitions and types a run's checkpoint files (besides the model itself): the resume
    decides its load route on it (launcher/checkpoint/resume.py), the numerics guard rewinds only to a
    checkpoint of the running shape (launcher/train/guard_actions.py)."""

    zero_stage: int
    """zero_optimization.stage: 0, 1, 2 or 3."""
    precision: str
    """fp32, fp16 or bf16 (launcher/config/precision.py)."""
    world_size: int
    """Data-parallel ranks."""

    @classmethod
    def of_sidecar(cls, sidecar) -> "RunShape":
        """The shape a checkpoint was saved with (its CheckpointSidecar)."""
        return cls(sidecar.zero_stage, sidecar.precision, sidecar.world_size)

    def __str__(self) -> str:
        return f"ZeRO-{self.zero_stage}, {self.precision}, {self.world_size} rank{'s' if self.world_size > 1 else ''}"

"""The checkpoint sidecar: `checkpoints/<tag>/sidecar.json`, one writer and one reader.

Rank 0 writes it LAST, after every rank has written its DeepSpeed files, so its presence (with
`complete: true`) marks a finished save: a checkpoint without one is never resumed from or exported.
It records where the run is (step, stage, data position, counters), what was trained (the model
config, the tokenizer's sha256) and how (world size, precision, ZeRO stage, loss scale), and the size
and sha256 of every other file of the checkpoint, checked before anything loads it
(launcher/run_dir/checkpoint_files.py). The trainer writes it; resume, export, the model card and the
stage-end evals read it. The same content (without the file records, which exist only after the
save) goes into DeepSpeed's client state, which resume checks against it.

Formats: 1 (before checksums and the tokenizer were recorded) is still read; its missing fields are
None and are not written back, so a format-1 sidecar round-trips unchanged.
"""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from launcher.errors import UserError
from launcher.io import atomic_write_json
from launcher.run_dir.layout import SIDECAR_NAME, sidecar_path

SIDECAR_FORMAT = 2


class MissingSidecar(UserError):
    """No sidecar.json: a save that did not finish (a partial checkpoint, not a damaged one)."""


class NewerSidecarFormat(UserError):
    """A sidecar written by a newer release: not damaged, just not ours to read (refused, never set aside)."""


@dataclass
class CheckpointSidecar:
    tag: str
    """Directory name under checkpoints/ (tag_for_step(step))."""
    step: int
    """Optimizer steps completed (skipped fp16 steps included) = index of the next step."""
    stage_index: int
    """0-based stage of the last step taken."""
    stage_name: str
    step_in_stage: int
    """Steps of that stage completed (1-based count)."""
    stage_complete: bool
    """The checkpoint is at the stage's end."""
    consumed_samples: int
    """Sequences trained on, over all ranks."""
    consumed_tokens: int
    """Non-padding tokens trained on, over all ranks."""
    last_validation: dict
    """Latest validation: step, stage, max_seq_len, loss, mlm_accuracy ({} before the first one)."""
    data_state: dict
    """data_pipeline.PretrainBatches.state_dict(): the global data position (same on every rank)."""
    model_config: dict
    """roformer.RoFormerConfig.to_dict() of the trained model."""
    world_size: int
    """Ranks that wrote the checkpoint (another world size resumes through a universal checkpoint)."""
    loss_scale: float
    """Dynamic fp16 loss scale at save time (1.0 for fp32 / bf16)."""
    skipped_steps: int
    """fp16 steps skipped on overflow so far."""
    zero_stage: int
    precision: str
    """"fp32", "fp16" or "bf16"."""
    total_steps: int
    """Steps of the whole schedule."""
    tokenizer_sha256: str | None = None
    """sha256 of the spm.model the run trained with (the data manifest's tokenizer.sha256): export
    packs only this tokenizer, resume refuses another. None in format 1."""
    files: dict | None = None
    """Every other file of the checkpoint directory: name -> {"bytes": size, "sha256": hex digest},
    recorded at save time after the files were flushed to disk. None in format 1."""
    rope_theta: float | None = None
    """RoPE base in force at this checkpoint (the stage's rope_theta, launcher/config/schedule.py): what
    export and evaluation must use. None for models without RoPE and in sidecars written before
    per-stage theta existed: then model_config's rope_theta is the one (same format number: a reader
    that predates the field ignores it)."""
    mask_prob: float | None = None
    """Share of tokens chosen for MLM in force at this checkpoint (the stage's mask_prob, else the run
    config's data.masking.mask_prob). None in sidecars written before per-stage mask rates: then the
    run config's rate was the only one (same format number: an older reader ignores the field)."""
    mixture: dict | None = None
    """The stage's data mixture in force at this checkpoint ({source: share}, shares summing to 1). None
    when the stage draws the sources by their size, and in sidecars written before mixtures existed."""
    complete: bool = True
    """Written last: False or absent means the save did not finish."""
    format: int = SIDECAR_FORMAT
    saved_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))

    def to_dict(self) -> dict:
        """The JSON object; optional fields that are None (a format-1 sidecar's) are left out."""
        return {k: v for k, v in dataclasses.asdict(self).items() if not (v is None and k in _OPTIONAL_FIELDS)}

    @classmethod
    def from_dict(cls, raw: object, where: str) -> "CheckpointSidecar":
        """Check every field's presence and type; errors name the file and the field."""
        if not isinstance(raw, dict):
            raise UserError(f"{where}: a sidecar is a JSON object")
        values = {}
        for f in dataclasses.fields(cls):
            if f.name not in raw:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise UserError(f"{where}: field '{f.name}' missing")
                continue
            value = raw[f.name]
            kind = _FIELD_TYPES[f.type.removesuffix(" | None")]
            if value is None and f.name in _OPTIONAL_FIELDS:
                values[f.name] = value
                continue
            if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
                raise UserError(f"{where}: field '{f.name}' must be {f.type}, got {value!r}")
            values[f.name] = value
        return cls(**values)


# Annotations are strings (postponed evaluation): the JSON types each stands for.
_FIELD_TYPES = {"str": str, "int": int, "bool": bool, "dict": dict, "float": (int, float)}
_OPTIONAL_FIELDS = frozenset(f.name for f in dataclasses.fields(CheckpointSidecar) if f.type.endswith(" | None"))


def effective_rope_theta(sidecar: CheckpointSidecar) -> float | None:
    """The RoPE base the checkpoint's weights were last trained with (None: not a RoPE model)."""
    if sidecar.rope_theta is not None:
        return sidecar.rope_theta
    return sidecar.model_config.get("rope_theta", 10000.0) if sidecar.model_config.get(
        "position_encoding", "rope") == "rope" else None


def saved_model_config(checkpoint_dir: Path, sidecar: CheckpointSidecar):
    """The RoFormerConfig the checkpoint was saved with: roformer.config.ConfigError naming this sidecar.json's
    model_config field when it is not one of this project's models (imported here: the catalogue, which reads
    sidecars for the report, stays free of torch)."""
    from roformer.config import RoFormerConfig

    return RoFormerConfig.from_dict(sidecar.model_config, source=f"{sidecar_path(checkpoint_dir)}: model_config")


def write_sidecar(checkpoint_dir: Path, sidecar: CheckpointSidecar) -> None:
    """The completion marker (call after every rank finished its files)."""
    atomic_write_json(sidecar_path(checkpoint_dir), sidecar.to_dict())


def read_sidecar(checkpoint_dir: Path) -> CheckpointSidecar:
    """The sidecar of a complete checkpoint; UserError naming the file and what is wrong otherwise."""
    path = sidecar_path(checkpoint_dir)
    if not path.is_file():
        raise MissingSidecar(f"{checkpoint_dir}: partial checkpoint: {SIDECAR_NAME} missing (the save did not finish)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: not valid JSON ({err})") from None
    if isinstance(raw, dict) and raw.get("complete") is not True:
        raise UserError(f"{path}: partial checkpoint: the sidecar says the save is not complete")
    sidecar = CheckpointSidecar.from_dict(raw, where=str(path))
    if sidecar.format > SIDECAR_FORMAT:
        raise NewerSidecarFormat(f"{path}: sidecar format {sidecar.format} is newer than this release reads "
                                 f"({SIDECAR_FORMAT}); use the release that wrote it")
    return sidecar

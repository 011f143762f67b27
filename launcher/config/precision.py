"""The one answer to "what precision does this DeepSpeed config train in": fp32, fp16 or bf16.

Every reader of a run's precision calls `train_precision` (plan's estimate and its summary line, the
report, the resume checks, the checkpoint sidecar, the accelerator pre-flight check), so that a
config cannot be planned in one precision and trained in another.

It reads the sections the way DeepSpeed 0.19's own parser does (deepspeed/runtime/precision_config.py):
  - `fp16: {enabled: ...}` is fp16;
  - `bf16: {enabled: ...}` is bf16, and so is the older spelling `bfloat16`, which DeepSpeed reads
    only when there is no `bf16` key at all (a present `bf16` wins even when disabled);
  - neither enabled: fp32.
Refused here, one line naming the field, instead of being trained in a precision nobody asked for:
  - `enabled: "auto"` (a Hugging Face Trainer placeholder: DeepSpeed's config model drops "auto"
    values, so the run would silently train in fp32);
  - a value that is not true / false, a section that is not a mapping;
  - fp16 and bf16 both enabled (DeepSpeed asserts), `bf16` and `bfloat16` both given (DeepSpeed
    silently ignores `bfloat16`);
  - `torch_autocast.enabled: true` (fp32 weights with autocast compute: neither the memory estimate
    nor the checkpoint precision of this project describes it).
Pure Python (no DeepSpeed import): `roformer report` and `roformer plan --help` stay light.
"""
from __future__ import annotations

from collections.abc import Mapping

from launcher.common.errors import UserError

BF16_KEYS = ("bf16", "bfloat16")
"""DeepSpeed's two spellings of the bf16 section, in the order it looks for them."""


def train_precision(ds_config: Mapping, source: str = "DeepSpeed config") -> str:
    """fp32, fp16 or bf16 for a DeepSpeed config (a JSON mapping); UserError naming `source` and the
    field for anything DeepSpeed would read differently from what it says."""
    if not isinstance(ds_config, Mapping):
        raise UserError(f"{source}: a DeepSpeed config must be a mapping, got {type(ds_config).__name__}")
    present = [key for key in BF16_KEYS if key in ds_config]
    if len(present) == 2:
        raise UserError(f"{source}: both bf16 and bfloat16 are given; DeepSpeed reads bf16 only and ignores "
                        f"bfloat16: keep one of them")
    fp16 = _enabled(ds_config, "fp16", source)
    bf16 = _enabled(ds_config, present[0], source) if present else False
    if fp16 and bf16:
        raise UserError(f"{source}: fp16.enabled and {present[0]}.enabled are both true; DeepSpeed trains in one "
                        f"of them: set the other to false")
    autocast = ds_config.get("torch_autocast")
    if isinstance(autocast, Mapping) and autocast.get("enabled") is True:
        raise UserError(f"{source}: torch_autocast.enabled: true is not supported here (the memory estimate, "
                        f"the checkpoints and resume know fp32 / fp16 / bf16 only): use an fp16 or bf16 section")
    return "fp16" if fp16 else "bf16" if bf16 else "fp32"


def _enabled(ds_config: Mapping, key: str, source: str) -> bool:
    section = ds_config.get(key)
    if section is None:
        return False
    if not isinstance(section, Mapping):
        raise UserError(f"{source}: {key}: must be a mapping like {{\"enabled\": true}}, got {section!r}")
    value = section.get("enabled", False)
    if value == "auto":
        raise UserError(f"{source}: {key}.enabled: \"auto\" is a Hugging Face Trainer placeholder that DeepSpeed "
                        f"itself drops (the run would train in fp32): set true or false")
    if not isinstance(value, bool):
        raise UserError(f"{source}: {key}.enabled: must be true or false, got {value!r}")
    return value

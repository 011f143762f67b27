"""A host batch (data_pipeline's CPU tensors) on its way to the rank's device.

On an accelerator (launcher/train/trainer.py calls these for every micro-batch):
- what the step needs to know about a batch (masked and real token counts) is read from the host
  tensors before the copy: reading it from device tensors is a host sync per micro-batch;
- the copy is from pinned memory (`get_accelerator().pin_memory`) with non_blocking=True, so it is a
  DMA that overlaps the host's work, not a synchronous copy through a staging buffer;
- an attention mask with no padding (packed pretraining rows, the common case) is not sent: the
  model then passes SDPA no mask, which lets it pick the flash kernel on A100 / H100 (SDPA's flash
  kernel takes no attn_mask; with one it falls back to the memory-efficient kernel). The model does
  the same by itself on CPU tensors (roformer/model.py), where reading the flag costs nothing.
On the CPU the batch is used as it is.
"""
from __future__ import annotations

import torch

from data_pipeline.masking import IGNORE_INDEX


def host_counts(batch: dict) -> tuple[int, int]:
    """(masked tokens, real tokens) of a host batch."""
    return int((batch["labels"] != IGNORE_INDEX).sum()), int(batch["attention_mask"].sum())


def to_device(batch: dict, device) -> dict:
    """The batch on `device` (see the module docstring); the host batch is not changed."""
    device = torch.device(device)
    if device.type == "cpu":
        return dict(batch)
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    moved = {}
    for key, tensor in batch.items():
        if key == "attention_mask" and bool(tensor.all()):
            continue  # no padding: no mask (flash-eligible), see the module docstring
        pinned = accelerator.pin_memory(tensor) if accelerator.device_name() != "cpu" else tensor
        moved[key] = pinned.to(device, non_blocking=True)
    return moved

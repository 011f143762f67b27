"""A host batch (data_pipeline's CPU tensors) on its way to the rank's device.

On an accelerator: token counts are read from the host tensors before the copy (on the device each read
is a host sync); the copy is from pinned memory with non_blocking=True (a DMA that overlaps the host's
work); a mask without padding is not sent, so SDPA gets no mask and may pick the flash kernel; a batch with
`document_ids` also gets its documents' offsets `cu_seqlens`, worked out here on the host, with which the model
runs one variable-length FlashAttention call where the device has it (roformer/attention.py). On the CPU the
batch is used as it is.
"""
from __future__ import annotations

import torch

from data_pipeline.documents import document_offsets
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
    if "document_ids" in batch:
        offsets = document_offsets(batch["document_ids"].numpy(), batch["attention_mask"].numpy())
        batch = {**batch, "cu_seqlens": torch.from_numpy(offsets)}
    for key, tensor in batch.items():
        if key == "attention_mask" and bool(tensor.all()):
            continue  # no padding: no mask (flash-eligible), see the module docstring
        pinned = accelerator.pin_memory(tensor) if accelerator.device_name() != "cpu" else tensor
        moved[key] = pinned.to(device, non_blocking=True)
    return moved

"""The export's last check: transformers, loading what was written, gives our logits."""
from __future__ import annotations

from pathlib import Path

from launcher.common.errors import UserError

PARITY_ATOL = 1e-4  # max |logit difference| between our model and transformers' on the export (fp32)


def check_logits(model, hf, export_dir: Path, what: str, length: int = 24) -> float:
    """Max |logit difference| of `model` and the transformers model `hf` on random ids; UserError above PARITY_ATOL."""
    import torch

    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, model.config.vocab_size, (2, length), generator=generator)  # (B, T), no special ids
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, length * 2 // 3:] = 0  # one padded row checks the mask convention too
    with torch.no_grad():
        ours = model(input_ids, attention_mask=attention_mask).logits
        theirs = hf(input_ids=input_ids, attention_mask=attention_mask).logits
    real = attention_mask.bool()
    diff = (ours[real] - theirs[real]).abs().max().item()
    if not diff <= PARITY_ATOL:
        raise UserError(f"{export_dir}: {what} reproduces our logits only to {diff:.3g} (> {PARITY_ATOL}); export "
                        "aborted, nothing replaced")
    return diff

"""Part (a) of `roformer gpu-check`: our model's forward and backward on the GPU in fp32, fp16 and bf16
(where the GPU has it) against our fp32 and against transformers' RoFormerForMaskedLM in the same
precision, from the same weights (our export loaded by transformers) and batch. Eval mode: dropout
draws differ between the two implementations, the arithmetic must not.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from launcher.gpu_check.check_report import Check, tolerance_check
from launcher.gpu_check.side_by_side import make_batch
from roformer import RoFormerConfig, RoFormerForMaskedLM, save_pretrained
from roformer.hf_interop import to_hf_state_dict

CONFIG = RoFormerConfig(vocab_size=2000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                        intermediate_size=1024)
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def supported_precisions(device: torch.device) -> list[str]:
    """fp32 and fp16 everywhere; bf16 where the GPU computes it natively (compute capability 8.0+: not V100)."""
    return ["fp32", "fp16"] + (["bf16"] if torch.cuda.is_bf16_supported(including_emulation=False) else [])


# fp16 backward under a static loss scale, as training runs it (DeepSpeed's dynamic scaling): unscaled, the
# query/key bias gradients (~1e-5 here, the largest 0.24) fall below fp16's smallest normal (6e-5).
LOSS_SCALE = {"fp16": 2.0 ** 10}


def _run(model, batch: dict, loss_scale: float = 1.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """fp32 logits (no labels: every position) and each parameter's fp32 gradient of the masked-LM loss."""
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    (model(**batch).loss * loss_scale).backward()
    # Copies: Module.cpu()/.to() later move a parameter's .grad in place, which would move these too.
    grads = {name: p.grad.detach().float().clone() / loss_scale for name, p in model.named_parameters()
             if p.grad is not None}
    return logits, grads


def _compare(name: str, key: str, a: torch.Tensor, b: torch.Tensor) -> Check:
    return tolerance_check("numerics", name, key, float((a - b).abs().max()), float(b.abs().max()))


def _grad_check(name: str, key: str, ours: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> Check:
    """The worst parameter (relative to its own scale)."""
    worst = max(((float((ours[k] - reference[k]).abs().max()), float(reference[k].abs().max()), k)
                 for k in reference if k in ours), key=lambda t: t[0] / t[1] if t[1] else t[0])
    check = tolerance_check("numerics", name, key, worst[0], worst[1])
    check.detail += f" in {worst[2]}"
    return check


def check_numerics(device: torch.device, precisions: list[str] | None = None, batch_size: int = 4,
                   seq_len: int = 128) -> list[Check]:
    """The checks of part (a) on `device` (precisions: default supported_precisions(device))."""
    import transformers

    precisions = supported_precisions(device) if precisions is None else precisions
    torch.manual_seed(0)
    ours32 = RoFormerForMaskedLM(CONFIG).eval()
    weights = {key: value.clone() for key, value in ours32.state_dict().items()}
    batch = make_batch(CONFIG.vocab_size, batch_size, seq_len, device=device)
    batch["attention_mask"][1, seq_len // 2:] = 0  # one padded row: the mask path too
    batch["labels"][1, seq_len // 2:] = -100
    reference_logits, reference_grads = _run(ours32.to(device), batch)
    reference_grads = to_hf_state_dict(reference_grads)
    checks = []
    with tempfile.TemporaryDirectory() as tmp:
        export = save_pretrained(ours32.cpu(), Path(tmp) / "export")
        for precision in precisions:
            dtype = DTYPES[precision]
            ours = RoFormerForMaskedLM(CONFIG).eval()
            ours.load_state_dict(weights)
            theirs = transformers.RoFormerForMaskedLM.from_pretrained(export).eval()
            scale = LOSS_SCALE.get(precision, 1.0)
            logits, grads = _run(ours.to(device=device, dtype=dtype), batch, scale)
            hf_logits, hf_grads = _run(theirs.to(device=device, dtype=dtype), batch, scale)
            grads = to_hf_state_dict(grads)  # under transformers' parameter names (the export's key map)
            key = precision
            if precision != "fp32":
                checks.append(_compare(f"{precision} logits vs our fp32", f"{key}_logits", logits, reference_logits))
                checks.append(_grad_check(f"{precision} gradients vs our fp32", f"{key}_grads", grads,
                                          reference_grads))
            checks.append(_compare(f"{precision} logits vs transformers {precision}", f"{key}_logits", logits,
                                   hf_logits))
            checks.append(_grad_check(f"{precision} gradients vs transformers {precision}", f"{key}_grads", grads,
                                      hf_grads))
    if "bf16" not in precisions:
        checks.append(Check("numerics", "bf16: not on this GPU (compute capability < 8.0)", None))
    return checks

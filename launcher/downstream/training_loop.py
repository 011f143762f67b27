"""What every fine-tuning loop shares (classification, regression and retrieval): the rows a seed trains
on, AdamW with linear warmup/decay, and one update step."""
from __future__ import annotations

from launcher.deepspeed_env.lean_imports import optimizers_without_dynamo


def training_rows(size: int, max_examples: int | None, seed: int) -> list[int]:
    """The train split's rows one seed trains on, in file order: all, or a seeded random subset."""
    import torch

    if max_examples is None or max_examples >= size:
        return list(range(size))
    order = torch.randperm(size, generator=torch.Generator().manual_seed(seed)).tolist()
    return sorted(order[:max_examples])


def optimizer_and_schedule(model, cfg, total_steps: int):
    """AdamW (no weight decay on biases and LayerNorm weights) and its warmup/linear-decay schedule;
    `cfg` carries lr, weight_decay and warmup_ratio (a FinetuneConfig)."""
    import torch

    decay, no_decay = [], []
    for name, param in model.named_parameters():
        (no_decay if param.ndim < 2 else decay).append(param)  # biases and LayerNorm weights
    optimizers_without_dynamo()
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr)
    warmup = max(1, int(cfg.warmup_ratio * total_steps))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def optimizer_step(model, loss, optimizer, scheduler) -> None:
    """Backward, gradients clipped to norm 1.0, AdamW step, schedule step: every fine-tuning loop's update."""
    import torch

    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    scheduler.step()

"""TEST-ONLY rank program: how much of the gradient each fp16 optimizer step of DeepSpeed applies.

    python -m tests.support.loss_scale_probe ZERO_STAGE STEPS   (one rank: DeepSpeed's launcher or the fork server's)

A bias-free Linear(4, 1) whose loss is the sum of its output on an all-ones input has the gradient 1
in every weight, every step; plain SGD (lr 1/16, no momentum, no clipping) must then move each weight
by exactly -1/16 per step (all values exact in fp16). The dynamic loss scale starts at 2^4 and grows
every 2 overflow-free steps. Prints one JSON line per step: the loss scale before and after it and
the fraction of the gradient the step applied (weight change / (lr x gradient)).
"""
from __future__ import annotations

import json
import sys

LR = 1 / 16


def main(zero_stage: int, steps: int) -> None:
    import deepspeed
    import torch

    from launcher.deepspeed_env.process_group import init_distributed
    from launcher.deepspeed_env.engine_state import loss_scale
    from tests.support.fp16_cpu import enable_fp16_on_cpu

    enable_fp16_on_cpu()
    init_distributed()
    model = torch.nn.Linear(4, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    config = {"train_batch_size": 1, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
              "fp16": {"enabled": True, "initial_scale_power": 4, "loss_scale_window": 2, "hysteresis": 1,
                       "min_loss_scale": 1},
              "zero_optimization": {"stage": zero_stage}, "zero_allow_untested_optimizer": True,
              "gradient_clipping": 0.0, "steps_per_print": 10**9}
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    inputs = torch.ones(1, 4, dtype=torch.half)

    def weight():  # ZeRO-3 holds only a partition between forward passes
        with deepspeed.zero.GatheredParameters(engine.module.weight, enabled=zero_stage == 3):
            return engine.module.weight.detach().double().clone()

    for step in range(steps):
        before, scale = weight(), loss_scale(engine)
        engine.backward(engine(inputs).float().sum())
        engine.step()
        applied = (before - weight()) / LR  # / the gradient, 1 everywhere
        print(json.dumps({"step": step, "scale_before": scale, "scale_after": loss_scale(engine),
                          "applied": sorted(set(applied.flatten().tolist()))}), flush=True)


if __name__ == "__main__":
    zero_stage, steps = (int(a) for a in sys.argv[1:] if not a.startswith("--local_rank"))  # added by the launcher
    main(zero_stage, steps)

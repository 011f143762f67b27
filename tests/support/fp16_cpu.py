"""TEST-ONLY: make DeepSpeed's CPU accelerator report fp16 support.

DeepSpeed refuses fp16 on this CPU ("Type fp16 is not supported on your device"). Reporting support
lets the real fp16 optimizer (dynamic loss scaling, overflow skips) run on CPU, so the V100 fp16
configs' code path is exercised here. Never imported by production code.
"""
from __future__ import annotations

import torch


def enable_fp16_on_cpu() -> None:
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    CPU_Accelerator.is_fp16_supported = lambda self: True
    CPU_Accelerator.supported_dtypes = lambda self: [torch.float, torch.bfloat16, torch.float16]

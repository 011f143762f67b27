"""TEST-ONLY: make DeepSpeed's CPU accelerator report fp16 support (tests/support/cpu_precision.py).

DeepSpeed refuses fp16 on a CPU without fp16 kernels ("Type fp16 is not supported on your device").
Reporting support lets the real fp16 optimizer (dynamic loss scaling, overflow skips) run on any CPU,
so the V100 fp16 configs' code path is exercised here; on a CPU that has fp16 (AVX512-FP16 / AMX) it
changes nothing. Never imported by production code.
"""
from __future__ import annotations

from tests.support.cpu_precision import pin_for_this_process


def enable_fp16_on_cpu() -> None:
    pin_for_this_process(fp16=True)

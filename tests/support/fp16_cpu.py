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


def fp16_rank_env() -> dict[str, str]:
    """The environment a rank needs to train in fp16 here: nothing where DeepSpeed's CPU accelerator has
    fp16 (the real path, unshimmed), ROFORMER_TEST_FP16_CPU=1 (tests/support/rank_wrapper.py) elsewhere."""
    from tests.support.cpu_precision import real_cpu_precision

    return {} if real_cpu_precision()["fp16"] else {"ROFORMER_TEST_FP16_CPU": "1"}

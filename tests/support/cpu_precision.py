"""TEST-ONLY: pin what DeepSpeed's CPU accelerator answers about fp16 / bf16, so no test depends on the CPU.

DeepSpeed's CPU accelerator asks the CPU: `is_fp16_supported()` is True where oneDNN has fp16 kernels
(a Xeon with AVX512-FP16 / AMX: `torch.ops.mkldnn._is_mkldnn_fp16_supported()`) and None elsewhere;
`is_bf16_supported()` is True on every CPU in the DeepSpeed we pin, but a later release may ask the CPU
too. A test that expects one answer pins it instead of inheriting the machine's:

  in the test's own process   pin_cpu_accelerator(monkeypatch, fp16=False)  (undone after the test; the
                              accelerator is a CPU one even on a machine that would detect a GPU)
  in a rank process           pin_for_this_process(fp16=True): ROFORMER_TEST_FP16_CPU=1 in the rank's
                              environment does it (tests/support/fp16_cpu.py, tests/support/rank_wrapper.py)

A test of the real path asks `real_cpu_precision()` and asserts what that answer calls for, so the same
test runs the real mixed-precision path where the CPU has it and checks the refusal where it has not.
Never imported by production code.
"""
from __future__ import annotations

_REAL: dict[str, bool] = {}  # the unpinned answers, asked once before this module first pins anything


def _pinned(fp16: bool | None, bf16: bool | None) -> dict:
    """The CPU_Accelerator methods that report precision support, answering fp16 / bf16 (None: the real
    answer); supported_dtypes() agrees with them, as DeepSpeed's engine asks that too."""
    import torch

    real = real_cpu_precision()
    fp16, bf16 = (real["fp16"] if fp16 is None else fp16), (real["bf16"] if bf16 is None else bf16)
    dtypes = [torch.float] + [torch.bfloat16] * bf16 + [torch.float16] * fp16
    return {"is_fp16_supported": lambda self: fp16, "is_bf16_supported": lambda self: bf16,
            "supported_dtypes": lambda self: list(dtypes)}


def real_cpu_precision() -> dict[str, bool]:
    """{"fp16": ..., "bf16": ...}: what DeepSpeed's CPU accelerator answers on this machine, unpinned."""
    if not _REAL:
        from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

        accelerator = CPU_Accelerator()
        _REAL.update(fp16=bool(accelerator.is_fp16_supported()), bf16=bool(accelerator.is_bf16_supported()))
    return dict(_REAL)


def pin_cpu_accelerator(monkeypatch, *, fp16: bool | None = None, bf16: bool | None = None) -> None:
    """For one test: get_accelerator() is a CPU accelerator answering fp16 / bf16 (None: the real answer)."""
    from deepspeed.accelerator import real_accelerator
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    for name, method in _pinned(fp16, bf16).items():
        monkeypatch.setattr(CPU_Accelerator, name, method)
    monkeypatch.setattr(real_accelerator, "ds_accelerator", CPU_Accelerator())


def pin_for_this_process(*, fp16: bool | None = None, bf16: bool | None = None) -> None:
    """In a rank process (never in pytest's): DeepSpeed's CPU accelerator answers fp16 / bf16 (None: the
    real answer) for the life of the process."""
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    for name, method in _pinned(fp16, bf16).items():
        setattr(CPU_Accelerator, name, method)

"""Runs the parts of `roformer gpu-check` on this machine's GPUs and assembles the report (report.py)."""
from __future__ import annotations

import time
import traceback
from pathlib import Path

from launcher.gpu_check.check_report import GpuCheckReport
from launcher.gpu_check.pretraining import check_pretraining

PARTS = ("numerics", "pretraining", "speed", "memory", "profile")


def device_info() -> dict:
    import torch

    properties = torch.cuda.get_device_properties(0)
    return {"name": properties.name, "capability": f"{properties.major}.{properties.minor}",
            "memory_gib": properties.total_memory / 2 ** 30, "count": torch.cuda.device_count(),
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "bf16": torch.cuda.is_bf16_supported(including_emulation=False)}


def run_parts(parts: list[str], work: Path, iters: int, say=print) -> GpuCheckReport:
    """Every part in `parts`; a part that raises is one error line of the report (and a FAILED verdict)."""
    import torch

    from launcher.common.errors import UserError
    from launcher.deepspeed_env.node_check import gather_facts, wheel_refusal

    facts = gather_facts()  # first: a wheel without this GPU's kernels fails every part below, less clearly
    refusal = wheel_refusal(facts)
    if refusal:
        raise UserError(refusal)
    say(f"gpu-check: torch {facts.torch_version} carries {', '.join(facts.arch_list)}; FusedAdam {facts.fused_adam}")
    device = torch.device("cuda", 0)
    report = GpuCheckReport(device_info())
    for part in parts:
        start = time.monotonic()
        say(f"gpu-check: {part} ...")
        try:
            if part == "numerics":
                from launcher.gpu_check.numerics import check_numerics

                report.checks += check_numerics(device)
            elif part == "pretraining":
                report.checks += check_pretraining(work / "pretraining", torch.cuda.device_count())
            elif part == "speed":
                from launcher.gpu_check.speed_memory import check_speed

                report.speed += check_speed(device, iters=iters)
            elif part == "memory":
                from launcher.gpu_check.speed_memory import check_memory

                report.checks.append(check_memory(device))
            elif part == "profile":
                from launcher.gpu_check.speed_memory import REFERENCE_MODEL
                from launcher.gpu_check.step_profile import profile_steps

                report.profile += profile_steps(device, REFERENCE_MODEL, iters=iters, say=say)
        except Exception as err:  # a part that cannot run is a failed part, named, and the others still run
            report.errors.append(f"{part}: {type(err).__name__}: {err}")
            (work / f"{part}.traceback.txt").write_text(traceback.format_exc())
        say(f"gpu-check: {part} done in {time.monotonic() - start:.0f} s")
    return report

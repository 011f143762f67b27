"""`roformer gpu-check`: prove a CUDA machine runs this project (launcher/gpu_check/, docs/gpu.md).

    roformer gpu-check [--parts numerics,pretraining,speed,memory,profile] [--out runs/gpu-check/report.json]

One JSON report (--out) and a console table. Exit 0 when every check passed, 1 when one failed or a
part could not run, 2 on a machine without a usable CUDA device (one line saying so) or bad flags.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from launcher.common.errors import UserError
from launcher.gpu_check.parts import PARTS


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated parts to run (default: all: {','.join(PARTS)})")
    from launcher.outputs.gate import GPU_CHECK_REPORT, add_output

    add_output(parser, "--out", GPU_CHECK_REPORT, default=Path("runs/gpu-check/report.json"),
               help="the JSON report (default: runs/gpu-check/report.json); the work files go into a work/ folder "
                    "beside it, which must be new, empty or an earlier gpu-check's")
    parser.add_argument("--iters", type=int, default=10, help="timed rounds of the speed part (default: 10)")


def parse_parts(text: str) -> list[str]:
    parts = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [part for part in parts if part not in PARTS]
    if unknown or not parts:
        raise UserError(f"--parts: unknown part(s) {', '.join(unknown) or '(none given)'} (known: {', '.join(PARTS)})")
    return parts


def cuda_refusal() -> str | None:
    """The one line to print where no CUDA device is usable, else None."""
    import torch

    from launcher.gpu_check.check_report import no_cuda_line

    return None if torch.cuda.is_available() else no_cuda_line(torch.__version__, torch.version.cuda)


def run(args: argparse.Namespace) -> int:
    parts = parse_parts(args.parts)
    if args.iters < 1:
        raise UserError(f"--iters: must be >= 1, got {args.iters}")
    work_folder("--out", args.out, create=False)  # a user's work/ beside the report: refused before anything
    refusal = cuda_refusal()
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    from launcher.gpu_check.parts import run_parts
    from launcher.common.io import atomic_write_json
    from launcher.deepspeed_env.ops_cache import prepare_arch_list
    from launcher.outputs.gate import GPU_CHECK_REPORT
    from launcher.outputs.written import record_written

    prepare_arch_list()  # the memory part builds FusedAdam in this process
    args.out = args.out.resolve()  # the run configs written under it name their schedule file by path
    work = work_folder("--out", args.out)
    report = run_parts(parts, work, args.iters, say=lambda text: print(text, file=sys.stderr, flush=True))
    atomic_write_json(args.out, report.to_dict())
    record_written(args.out, GPU_CHECK_REPORT.name, GPU_CHECK_REPORT.made_by)
    print(report.table())
    print(f"gpu-check: report in {args.out}")
    return 0 if report.passed else 1


def work_folder(flag: str, out: Path, create: bool = True) -> Path:
    """OUT's work/ folder, where the checks delete and rewrite their runs, data and export: new, empty or an
    earlier gpu-check's (marked by its record, launcher/outputs/written.py), never a user's `work/`; with
    `create`, made and marked as ours."""
    from launcher.outputs.gate import GPU_CHECK_WORK, gate
    from launcher.outputs.written import record_written

    work = Path(out).parent / "work"
    gate(flag, work, GPU_CHECK_WORK)
    if not create:
        return work
    work.mkdir(parents=True, exist_ok=True)
    record_written(work, GPU_CHECK_WORK.name, GPU_CHECK_WORK.made_by, marker=True)
    return work

"""`roformer report RUN_DIR [--out DIR]`: a one-page report.md of a run beside its plots.

Works on a running, stopped or finished run (a metrics line cut by a kill is skipped). Without
--out, writes RUN_DIR/report.md and refreshes RUN_DIR/plots/; with --out DIR, DIR/report.md and
DIR/plots/ (the run directory is only read). `--plots-only` renders the PNGs alone: what training
runs at every stage end and at its end (launcher.report.hook).
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from launcher.common.errors import UserError


@dataclass(frozen=True)
class ReportFiles:
    """What one `roformer report` wrote, and the state of the run it describes."""

    report: Path | None
    """report.md (None with --plots-only)."""
    plots: list[Path]
    """The PNGs written, in the report's order."""
    steps_done: int
    state: str
    """launcher.report.run_summary.RunStatus.state when the records were read."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="run directory of `roformer pretrain`")
    from launcher.outputs.gate import RUN_REPORT, add_output

    add_output(parser, "--out", RUN_REPORT, default=None, metavar="DIR",
               help="write report.md and plots/ here (default: RUN_DIR itself, i.e. RUN_DIR/report.md "
                             "and RUN_DIR/plots/)")
    parser.add_argument("--plots-only", action="store_true",
                        help="only render the PNGs into OUT/plots/, no report.md (default: off)")


def run(args: argparse.Namespace) -> int:
    from launcher.common.local_paths import refuse_url
    from launcher.outputs.output_paths import REPORT, check_paths, publishing, resolved_output

    refuse_url("RUN_DIR", args.run_dir)
    layout = check_run_dir(args.run_dir)
    out = args.out
    if out is not None and resolved_output("--out", out) == layout.root:
        out = None  # the default, spelled out
    if out is None:
        if not os.access(layout.root, os.W_OK | os.X_OK):
            raise UserError(f"RUN_DIR {args.run_dir}: read-only; write the report elsewhere with --out DIR")
        if not args.plots_only:  # RUN_DIR/report.md: replaced only while unchanged since `report` wrote it
            from launcher.outputs.gate import RUN_REPORT, gate

            gate("RUN_DIR", args.run_dir, RUN_REPORT)
        written = make_report(args.run_dir, None, plots_only=args.plots_only)
    else:  # missing, empty or an earlier report: never a folder of the user's own report.md or plots
        check_paths({"RUN_DIR": args.run_dir}, {"--out": out}, may_hold=("RUN_DIR",))
        with publishing("--out", out, REPORT, "roformer report") as where:
            written = make_report(args.run_dir, where, plots_only=args.plots_only)
    for path in written.plots:
        print(path)
    where = written.report or (written.plots[0].parent if written.plots else "no plot: no record yet")
    print(f"report: {len(written.plots)} plots of step {written.steps_done} ({written.state}) -> {where}",
          file=sys.stderr)
    if written.report is not None:  # the run's trackers get the page and the plots (and what they missed)
        from launcher.tracking.attach import sync_run

        sync_run(args.run_dir, [(written.report, ""), *((p, "plots") for p in written.plots)])
    return 0


def make_report(run_dir: Path, out: Path | None = None, plots_only: bool = False) -> ReportFiles:
    """Render the plots (and report.md unless plots_only) from the records as they are now. Holds
    the output's render lock throughout, so concurrent renders (training's, a user's) take turns."""
    from launcher.common.io import atomic_write_text
    from launcher.report.curves import load_curves
    from launcher.report.hook import render_lock
    from launcher.report.plots import render_all
    from launcher.report.run_report import write_report_text
    from launcher.report.run_summary import load_summary
    from launcher.run_dir.layout import RunDir

    layout = check_run_dir(run_dir)
    target = RunDir(Path(out).expanduser().resolve()) if out is not None else layout
    try:
        with render_lock(target.plots):
            curves = load_curves(layout.root)
            summary = load_summary(layout.root, curves)
            plots = render_all(curves, summary, target.plots)
            report = None
            if not plots_only:
                atomic_write_text(target.report, write_report_text(curves, summary, plots, target.report))
                report = target.report
            record_report(target, out is not None, report is not None)
    except PermissionError as err:
        raise UserError(f"{err.filename}: not writable ({err.strerror})"
                        + ("; write the report elsewhere with --out DIR" if out is None else "")) from None
    return ReportFiles(report, plots, curves.train.steps_done, summary.status.state)


def record_report(target, own_folder: bool, wrote_page: bool) -> None:
    """What this report wrote (launcher/outputs/written.py): every file of its own --out folder (checked before),
    or the run directory's report.md when it wrote it (never a plots-only render: an edit stays named), so a
    later report replaces them only while unchanged."""
    from launcher.outputs.gate import RUN_REPORT
    from launcher.outputs.written import record_written

    if own_folder:
        record_written(target.root, RUN_REPORT.name, RUN_REPORT.made_by)
    elif wrote_page:
        record_written(target.report, RUN_REPORT.name, RUN_REPORT.made_by)


def check_run_dir(run_dir: Path):
    """A run directory of `roformer pretrain`, known by its own records (launcher/outputs/output_paths.py): a
    folder with a config.yaml or metrics.jsonl of its own is not one."""
    from launcher.outputs.output_paths import is_run_dir
    from launcher.run_dir.layout import RunDir

    layout = RunDir(Path(run_dir).expanduser().resolve())
    if not layout.root.is_dir():
        raise UserError(f"{layout.root}: no such run directory")
    if not is_run_dir(layout.root):
        raise UserError(f"{layout.root}: not a run directory of `roformer pretrain` (none of the records a run "
                        "writes: stages.json, ds_config.resolved.json, heartbeats/run.lock ...)")
    return layout

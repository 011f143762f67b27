"""`roformer reproduce --out DIR [--quick] [--parts ...]`: the paper's claims at small scale.

Runs ordinary `roformer data prepare / pretrain / export / finetune` jobs (see
launcher/reproduce/reproduction_plan.py for the parts and the output layout), then writes DIR/report/
(report.md, PNG plots, results.json). Re-running the same command resumes: finished runs are
skipped, an interrupted pretraining run resumes from its newest checkpoint.
"""
from __future__ import annotations

import argparse
import platform
import subprocess
import time
from pathlib import Path

from launcher.common.cores import usable_cores
from launcher.common.errors import UserError
from launcher.common.io import atomic_write_json
from launcher.outputs.output_paths import REPRODUCTION_RECORD
from launcher.reproduce.job_runner import Layout
from launcher.reproduce.reproduction_plan import PARTS, PRESETS, PROJECT_ROOT


def configure(parser: argparse.ArgumentParser) -> None:
    from launcher.outputs.gate import CLAIMS_REPORT, REPRODUCED, add_output

    add_output(parser, "--out", REPRODUCED, required=True, help="output directory (created; re-running resumes)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny model, a few steps, one seed: checks the harness and the report's shape (~1 min)")
    parser.add_argument("--parts", default=None,
                        help=f"comma-separated subset of: {', '.join(PARTS)} (default: all; with --quick all but "
                             f"from-bert)")
    parser.add_argument("--data", type=Path, default=None,
                        help="use this prepared data directory for the ablations (default: prepare OUT/data)")
    parser.add_argument("--groups", default="",
                        help="run only the pretraining runs of these comparison groups (comma-separated, e.g. "
                             "sinusoidal,linear+sinusoidal); the report still covers every run present (default: every group)")
    parser.add_argument("--merge", type=Path, action="append", default=[],
                        help="an earlier results.json (or output directory holding report/results.json) whose "
                             "parts / comparison groups fill what this output directory has not run; repeatable, "
                             "the first given wins; the report's last table names each part's source (default: none)")
    add_output(parser, "--report-dir", CLAIMS_REPORT, default=None,
               help="write report.md, the PNGs and results.json here (default: OUT/report)")
    parser.add_argument("--report-only", action="store_true",
                        help="write the report from whatever runs exist; start nothing")


def parse_parts(text: str) -> tuple[str, ...]:
    parts = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [p for p in parts if p not in PARTS]
    if unknown or not parts:
        raise UserError(f"--parts: unknown part(s) {', '.join(unknown) or '(none given)'} (known: {', '.join(PARTS)})")
    return tuple(p for p in PARTS if p in parts)  # canonical order


def select_groups(runs: list, text: str) -> list:
    """The runs whose group is listed in `text` (all of them when it is empty)."""
    groups = {g.strip() for g in text.split(",") if g.strip()}
    if not groups:
        return runs
    unknown = sorted(groups - {r.group for r in runs})
    if unknown:
        raise UserError(f"--groups: no run of the chosen parts is in group(s) {', '.join(unknown)} "
                        f"(groups: {', '.join(sorted({r.group for r in runs}))})")
    return [r for r in runs if r.group in groups]


def run(args: argparse.Namespace) -> int:
    from launcher.outputs.output_paths import DATA, REPORT, REPRODUCTION, check_paths, check_replaceable, publishing

    preset = PRESETS["quick" if args.quick else "full"]()
    parts = parse_parts(args.parts if args.parts is not None else ",".join(preset.default_parts))
    if args.data is not None and not DATA.recognise(args.data):
        raise UserError(f"--data {args.data}: not a prepared data directory (no manifest.json of `roformer data "
                        f"prepare`)")
    check_paths({"--data": args.data, "--merge": args.merge}, {"--report-dir": args.report_dir})
    check_paths({"--data": args.data}, {"--out": args.out})  # reproduce --out DATA/sub would write into the data
    if args.report_dir is None:  # OUT/report: rewritten only while it holds what the last report wrote, unchanged
        check_replaceable("--out", Path(args.out) / "report", REPORT)
    priors = [read_prior(path) for path in args.merge]  # before any compute: a bad file fails at once
    select_groups(preset.pretrain_runs(parts), args.groups)  # an unknown group is refused before --out is made
    if args.groups and args.report_only:
        raise UserError("--groups: chooses the runs to start; --report-only starts none (the report covers every "
                        "run present): drop one of them")
    with publishing("--out", args.out, REPRODUCTION, "roformer reproduce") as out:
        record = out / REPRODUCTION_RECORD
        if not record.is_file():  # marks the folder as ours: a later run resumes in it
            out.mkdir(parents=True, exist_ok=True)
            atomic_write_json(record, {"format": "roformer-ds-reproduction", "preset": preset.name})
        path = _reproduce(args, preset, parts, Layout(out), priors)
        from launcher.outputs.written import record_written

        record_written(path.parent, REPORT.name, "roformer reproduce")
    print(f"reproduce: report -> {path}")
    return 0


def _reproduce(args: argparse.Namespace, preset, parts: tuple[str, ...], layout, priors: list) -> Path:
    """Run what is missing (unless --report-only), then write the report; returns report.md's path."""
    from launcher.reproduce.claims_report import write_report
    from launcher.reproduce.results import collect, merge
    from launcher.reproduce.job_runner import Runner

    started = time.time()
    if not args.report_only:
        runner = Runner(preset, layout, data_dir=args.data)
        pretrain_runs = select_groups(preset.pretrain_runs(parts), args.groups)
        chosen = {run.name for run in pretrain_runs}
        runner.prepare_data(pretrain_runs)
        runner.pretrain_all(pretrain_runs, export=preset.exported(parts))
        runner.finetune_all([r for r in preset.finetune_runs(parts) if r.pretrain in chosen])
        runner.evaluate_all([r for r in preset.eval_runs(parts) if r.pretrain in chosen])
    results = collect(preset, layout, parts)
    if priors:
        results = merge(results, priors, current=f"runs under `{display_path(layout.out)}`")
    results["wall_seconds_this_invocation"] = round(time.time() - started, 1)
    results["environment"] = {"commit": _commit(), "python": platform.python_version(), "machine": platform.machine(),
                              "cpus": usable_cores()}
    header = [f"Preset `{preset.name}`, parts: {', '.join(results['parts'])}; commit "
              f"`{results['environment']['commit']}`, {results['environment']['cpus']} CPU cores. Every number is in "
              f"`results.json`; every run is an ordinary run directory under `{display_path(layout.out)}/runs` "
              f"(re-running the command resumes / skips)" + ("; parts not run there come from earlier results "
                                                            "(last table)." if priors else ".")]
    return write_report(results, args.report_dir or layout.report, header)


def display_path(path: Path) -> str:
    """`path` relative to the working directory or the project when inside one (a committed report must
    not name this machine's absolute paths), else only its last component."""
    resolved = Path(path).resolve()
    for root in (Path.cwd(), PROJECT_ROOT):
        if resolved.is_relative_to(root.resolve()):
            return str(resolved.relative_to(root.resolve())) or "."
    return f"<{resolved.name}>"


def read_prior(path: Path) -> tuple[str, dict]:
    """(label, content) of an earlier results.json given to --merge (a file, or OUT with report/results.json)."""
    import json

    file = path / "report" / "results.json" if path.is_dir() else path
    try:
        content = json.loads(file.read_text(encoding="utf-8"))
    except OSError as err:
        raise UserError(f"--merge {path}: cannot read {file} ({err.strerror})") from None
    except ValueError as err:
        raise UserError(f"--merge {file}: not valid JSON ({err})") from None
    if not isinstance(content, dict) or not isinstance(content.get("parts"), list):
        raise UserError(f"--merge {file}: not a reproduction results.json (no 'parts' list)")
    commit = content.get("environment", {}).get("commit", "unknown")
    return f"`{display_path(file)}` (commit {commit})", content


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(PROJECT_ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


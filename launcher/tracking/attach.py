"""The trackers of a run from outside training: `roformer report RUN_DIR` (report.md and the plots) and
`roformer export` (the model card) attach their files to the run's tracked runs, and first send whatever the
trackers missed from metrics.jsonl (a server that was down). Only trackers the run already reports to (a
RUN_DIR/tracking/<tracker>.json) are touched; a failure is one warning line, never the command's. A start of
a run already at the end of its schedule catches up the trackers of its config the same way (rank 0:
launcher/train/rank.py), as the warning of a tracker that went down promised."""
from __future__ import annotations

import json
from pathlib import Path

from launcher.common.defaults import TRACKERS
from launcher.common.io import write_line
from launcher.run_dir.layout import RunDir
from launcher.run_dir.metrics_format import read_records
from launcher.run_dir.records import stage_ends as ends_of
from launcher.tracking.mlflow_backend import STATUS
from launcher.tracking.open_sinks import TrackedRun
from launcher.tracking.remote import Connection, tracking_dir


def tracked(run_dir: RunDir) -> list[str]:
    """The trackers this run reports to."""
    return [name for name in TRACKERS if (tracking_dir(run_dir) / f"{name}.json").is_file()]


def sync_run(run_dir, files: list[tuple[Path, str]], tracking: TrackedRun | None = None,
             ends: list[int] | None = None) -> None:
    """Catch up every tracker of RUN_DIR from metrics.jsonl and its stage-end evals, then attach `files`
    ((file, artifact folder) pairs). tracking: the run's sinks, parameters and tags as its config gives them
    (launcher/tracking/open_sinks.py tracked_run), for a tracked run created here; None: only the trackers
    the run already reports to. ends: each stage's end step when the caller resolved the stages (a rank),
    else read from RUN_DIR/stages.json."""
    run_dir = run_dir if isinstance(run_dir, RunDir) else RunDir(Path(run_dir))
    names = tracked(run_dir) if tracking is None else [name for name in TRACKERS if name in tracking.report_to]
    if not names:
        return
    params, tags = (tracking.params, tracking.tags) if tracking is not None else (None, None)
    ends = stage_ends(run_dir) if ends is None else ends
    records = read_records(run_dir.metrics)  # read once for every tracker
    outcome = last_outcome(records)
    for name in names:
        connection = Connection(name, run_dir, params or {}, tags or {}, ends)
        try:
            connection.open()
            connection.send_records(records)
            connection.send_evals()
            connection.send_files(files)
            connection.close(*outcome)  # a run that ended while the tracker was down ends there too
        except Exception as err:  # noqa: BLE001 - a tracker never fails the command
            write_line(f"tracking: {name} unreachable or refused ({type(err).__name__}: {str(err)[:300]}); "
                       f"the next start or `roformer report {run_dir.root}` sends what it missed")


def last_outcome(records: list[dict]) -> tuple[str | None, float | None]:
    """(outcome, time) of the run's last start: its finished / stopped / guard_stopped event, or (None, None)
    when that start has none (still running, or killed), so the tracked run's status is left as it is."""
    outcome = (None, None)
    for record in records:
        event = record.get("event") if record.get("kind") == "event" else None
        if event in STATUS:
            outcome = (event, record.get("time"))
        elif event in ("startup", "attempt", "resume"):  # a later start
            outcome = (None, None)
    return outcome


def stage_ends(run_dir: RunDir) -> list[int]:
    try:
        stages = json.loads(run_dir.stages.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    stages = stages.get("stages", stages) if isinstance(stages, dict) else stages
    return ends_of([s for s in stages if isinstance(s, dict) and {"index", "first_step", "steps"} <= set(s)])

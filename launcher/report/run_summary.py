"""Everything about a run directory except its curves: what ran (config, world size, precision,
ZeRO stage), where it is (checkpoints, running or stopped) and which evaluation reports it holds.

Every reader tolerates a missing or damaged file (a run is reported while it is being written):
what cannot be read is absent from the summary, and the report says so.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from launcher.checkpoint.catalogue import CheckpointCatalogue, CheckpointSidecar
from launcher.config.precision import train_precision
from launcher.common.errors import UserError
from launcher.common.io import read_json_object
from launcher.report.curves import Curves, record_versions, records_in_effect
from launcher.run_dir.records import RecordVersion, describe_start
from launcher.run_dir.layout import RunDir, step_of_tag
from launcher.run_dir.restart_records import RestartRecord, read_restarts

# metrics.jsonl events that begin or end a process's training (launcher/train/rank_entry.py).
START_EVENTS = ("startup", "resume")
END_EVENTS = ("finished", "stopped", "guard_stopped")
# JSON files of RUN_DIR that the run itself writes (not evaluation reports).
RUN_FILES = ("stages.json", "ds_config.resolved.json", "restarts.json")


@dataclass(frozen=True)
class RunStatus:
    state: str
    """"not started", "running", "finished", "stopped" or "not running" (no end record: killed?)."""
    detail: str
    """One sentence for a person (what happened last, and when)."""


@dataclass(frozen=True)
class EvalReport:
    """One evaluation JSON report found in the run directory."""

    path: Path
    label: str
    """How plots and tables name it: the file's stem, or `<tag> (<stage>)` for stage-end evals."""
    kind: str
    """"mlm" (eval-mlm: per-length results), "finetune" (fine-tune vs baseline) or "error"."""
    content: dict


@dataclass
class RunSummary:
    root: Path
    config: dict
    """The run config in effect (config.yaml or its newest version; {} when missing or unreadable)."""
    config_path: Path
    ds_config: dict
    world_size: int | None
    precision: str | None
    zero_stage: int | None
    total_steps: int | None
    checkpoints: list[CheckpointSidecar]
    """Complete checkpoints, oldest first (partial ones are not listed)."""
    status: RunStatus
    versions: list[RecordVersion] = field(default_factory=list)
    """config_versions.json: a resume with another config adds one ([] or one entry: never changed)."""
    evals: list[EvalReport] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    """Files that looked like reports but could not be read (named in the report)."""
    restarts: list[RestartRecord] = field(default_factory=list)
    """restarts.json: the faults `roformer pretrain --max-restarts` restarted after or gave up on."""
    started_from: str | None = None
    """branch_from.json or init_from.json in one line (launcher.run_dir.records.describe_start); None: random
    initialisation."""

    @property
    def latest(self) -> CheckpointSidecar | None:
        return self.checkpoints[-1] if self.checkpoints else None


def load_summary(run_dir: Path, curves: Curves, now: float | None = None) -> RunSummary:
    layout = RunDir(Path(run_dir))
    checkpoints = read_checkpoints(layout)
    records = records_in_effect(layout)
    ds_config = read_json_object(records["ds_config"])
    stages_file = read_json_object(records["stages"])
    latest = checkpoints[-1] if checkpoints else None
    world_size = stages_file.get("world_size") if isinstance(stages_file.get("world_size"), int) else None
    zero = (ds_config.get("zero_optimization") or {}).get("stage")
    evals, unreadable = find_eval_reports(layout)
    try:
        restarts, restarts_unreadable = read_restarts(layout), []
    except UserError:
        restarts, restarts_unreadable = [], [layout.restarts.name]
    return RunSummary(
        root=layout.root, config=_read_yaml(records["config"]), config_path=records["config"], ds_config=ds_config,
        world_size=world_size or (latest.world_size if latest else None),
        precision=_precision(ds_config) or (latest.precision if latest else None),
        zero_stage=zero if isinstance(zero, int) else (latest.zero_stage if latest else None),
        total_steps=curves.stages[-1].end_step if curves.stages and curves.stages[-1].steps else
        (latest.total_steps if latest else None),
        checkpoints=checkpoints, status=run_status(layout, curves, now), versions=record_versions(layout),
        evals=evals, unreadable=unreadable + restarts_unreadable, restarts=restarts,
        started_from=describe_start(layout))


def read_checkpoints(layout: RunDir) -> list[CheckpointSidecar]:
    """The sidecars of the complete checkpoints, oldest first (files not verified: a report reads no weights)."""
    return [entry.sidecar for entry in CheckpointCatalogue.scan(layout).complete()]


def run_status(layout: RunDir, curves: Curves, now: float | None = None) -> RunStatus:
    """From the last start/end event of metrics.jsonl, and how long ago the file last changed: a
    process that ended without an end record (SIGKILL, a node lost) stops writing."""
    now = time.time() if now is None else now
    last = next((e for e in reversed(curves.events) if e.get("event") in START_EVENTS + END_EVENTS), None)
    if last is None and not len(curves.train):
        return RunStatus("not started", "no training step recorded yet")
    ago = now - layout.metrics.stat().st_mtime if layout.metrics.is_file() else 0.0
    step = last.get("step") if last else None
    if last is not None and last["event"] == "finished":
        return RunStatus("finished", f"finished at step {step} ({_ago(now - last.get('time', now))})")
    if last is not None and last["event"] == "stopped":
        return RunStatus("stopped", f"stopped by a signal at step {step} after a checkpoint "
                                    f"({_ago(now - last.get('time', now))}); the same command resumes it")
    if last is not None and last["event"] == "guard_stopped":
        return RunStatus("stopped", f"stopped by the numerics guard at step {step} "
                                    f"({_ago(now - last.get('time', now))}); see the numerics guard table")
    recent = curves.train.step_time_s[-50:]
    step_time = float(np.nanmedian(recent)) if np.isfinite(recent).any() else 0.0
    # Quiet for much longer than a step (and than a checkpoint or validation could take): gone.
    if ago > max(600.0, 50 * step_time):
        return RunStatus("not running", f"no end record and nothing written for {_duration(ago)}: the run was "
                                        "killed or lost its node; the same command resumes it from the last checkpoint")
    return RunStatus("running", f"running (last record {_ago(ago)})")


def find_eval_reports(layout: RunDir) -> tuple[list[EvalReport], list[str]]:
    """JSON reports of eval-mlm and finetune in RUN_DIR (as scripts/demo.sh writes them) and RUN_DIR/evals/
    (stage-end evals), recognised by their content; other JSON files are ignored."""
    candidates = [p for p in sorted(layout.root.glob("*.json")) if p.name not in RUN_FILES]
    if layout.evals.is_dir():
        in_step_order = lambda p: (step_of_tag(p.name.split(".")[0]) or 0, p.name)  # noqa: E731  <tag>.<eval>.json
        candidates += sorted(layout.evals.glob("*.json"), key=in_step_order)
    reports, unreadable = [], []
    for path in candidates:
        try:
            content = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            unreadable.append(path.name)
            continue
        kind = eval_kind(content)
        if kind is None:
            continue
        label = path.stem
        if "tag" in content and "eval" in content:
            label = f"{content['eval']} @ {content['tag']}" + (f" ({content['stage']})" if content.get("stage") else "")
        reports.append(EvalReport(path=path, label=label, kind=kind, content=content))
    return reports, unreadable


def eval_kind(content: object) -> str | None:
    if not isinstance(content, dict):
        return None
    results = content.get("results")
    if isinstance(results, list) and results and all(isinstance(r, dict) and isinstance(r.get("seq_len"), int)
                                                     for r in results):
        return "mlm"
    if isinstance(content.get("test"), dict) and isinstance(content.get("majority_baseline"), dict):
        return "finetune"
    if "error" in content and "eval" in content:
        return "error"
    return None


def finetune_rows(evals: list[EvalReport]) -> list[dict]:
    """One row per fine-tune setting with the test scores of the pretrained export, its random-init
    twin and the majority baseline. The twin is either the report's own "random_init" entry
    (`finetune --compare-random-init`) or a separate report of the same setting whose config says
    init "random"; whichever is missing stays None."""
    rows: dict[tuple, dict] = {}
    for report in (r for r in evals if r.kind == "finetune"):
        content = report.content
        config = content.get("config") if isinstance(content.get("config"), dict) else {}
        key = (content.get("task"), config.get("max_length"), content.get("train_examples"), content.get("tag"))
        row = rows.setdefault(key, {"label": _finetune_label(content, config), "pretrained": None,
                                    "random_init": None, "majority": None, "source": []})
        twin = content.get("random_init")
        slot = "random_init" if config.get("init") == "random" else "pretrained"
        row[slot] = _scores(content.get("test"))
        if isinstance(twin, dict):
            row["random_init"] = _scores(twin.get("test")) or row["random_init"]
        row["majority"] = row["majority"] or _scores((content.get("majority_baseline") or {}).get("test"))
        row["source"].append(report.path.name)
    return list(rows.values())


def _finetune_label(content: dict, config: dict) -> str:
    label = f"{content.get('task', '?')}\nlen {config.get('max_length', '?')}, {content.get('train_examples', '?')} ex."
    return label + (f"\n@ {content['tag']}" if content.get("tag") else "")


def _scores(test: object) -> dict | None:
    """accuracy and macro_f1 of a split's scores, or None when they are not numbers."""
    if not isinstance(test, dict):
        return None
    values = {k: test.get(k) for k in ("accuracy", "macro_f1")}
    return values if all(isinstance(v, (int, float)) for v in values.values()) else None


def _precision(ds_config: dict) -> str | None:
    """The recorded DeepSpeed config's precision; None when there is none or it cannot be read (the
    report then falls back to the newest checkpoint's sidecar)."""
    if not ds_config:
        return None
    try:
        return train_precision(ds_config)
    except UserError:
        return None


def _read_yaml(path: Path) -> dict:
    try:
        value = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return value if isinstance(value, dict) else {}


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds / 3600:.1f} h"


def _ago(seconds: float) -> str:
    return f"{_duration(seconds)} ago"


"""RUN_DIR/restarts.json: every restart `roformer pretrain` made by itself after a fault, and the fault
that ended the run when it did not restart (launcher.launch.restart_loop decides; docs/unattended.md).

    {"restarts": [{"attempt": 1, "action": "restart", "time": "2026-11-25T04:10:02+0000",
                   "cause": "rank 1 (local rank 0) on node node2: killed by SIGKILL", "kind": "rank", ...}]}

One writer (`append_restart` / `update_restart`, whole-file atomic rewrites: a crash leaves the previous
list) and one reader (`read_restarts`). The report (launcher/report) reads it for its restarts table and
the marks on the loss plot. Steps follow metrics.jsonl's convention: steps completed.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace

from launcher.common.errors import UserError
from launcher.common.io import atomic_write_json
from launcher.run_dir.layout import RunDir

ACTIONS = ("restart", "gave up")


@dataclass
class RestartRecord:
    """One fault of the run and what `roformer pretrain` did about it."""

    attempt: int
    """Which start of this `roformer pretrain` the fault ended (1 = the first launch)."""
    action: str
    """"restart" (the job was started again) or "gave up" (the run ended here; `reason` says why)."""
    time: str
    """When the fault was seen (local time, ISO 8601)."""
    unix_time: float
    """The same, in seconds since the epoch (sub-second: what a benchmark subtracts)."""
    cause: str
    """The fault as the console named it: rank, node and status, or the hang verdict."""
    kind: str
    """"rank" (a rank died), "node" (a node's launcher exited), "hung" (the hang watchdog), "preempted"
    (the ranks got SIGTERM from outside), "preflight" (a restart's checks failed) or "launcher"."""
    node: str | None
    """The node it happened on (None when unknown)."""
    rank: int | None
    """The global rank (None when unknown)."""
    failed_at_step: int
    """Steps completed when the fault happened (the newest train record of metrics.jsonl)."""
    restarted_from_step: int
    """Steps completed in the checkpoint the restart resumes from (0: no checkpoint yet, from the start)."""
    restarted_from_tag: str | None
    """That checkpoint's tag (None: from the start)."""
    steps_lost: int
    """failed_at_step - restarted_from_step: steps trained again."""
    stop_seconds: float
    """From the fault being seen to the last process of the job ending."""
    backoff_seconds: float
    """The wait before the restart (0 when none was made)."""
    redo_seconds: float
    """The first run's step times of the lost steps (what training them again costs, about)."""
    restart_seconds: float | None = None
    """From the restart's launch to its first training step (None until it took one)."""
    seconds_lost: float | None = None
    """stop + backoff + restart + redo seconds (None until the restart took its first step)."""
    world_size: int | None = None
    """World size of the restarted job."""
    excluded_nodes: list = field(default_factory=list)
    """Nodes left out of the restarted job (--exclude-failed-nodes), all excluded so far."""
    reason: str = ""
    """Why the run was not restarted (action "gave up"), or a note on the restart."""


def read_restarts(run_dir: RunDir) -> list[RestartRecord]:
    """The records, oldest first ([] when the run never restarted). UserError naming the file and entry."""
    path = run_dir.restarts
    if not path.is_file():
        return []
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))["restarts"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UserError(f"{path}: not a restart record ({type(err).__name__}: {err})") from None
    known = {f.name for f in fields(RestartRecord)}
    records = []
    for number, entry in enumerate(entries, start=1):
        if not isinstance(entry, dict):
            raise UserError(f"{path}: restart {number}: expected a JSON object, got {entry!r}")
        unknown = sorted(set(entry) - known)
        if unknown:
            raise UserError(f"{path}: restart {number}: unknown field(s) {', '.join(unknown)}")
        try:
            record = RestartRecord(**entry)
        except TypeError as err:
            raise UserError(f"{path}: restart {number}: {err}") from None
        if record.action not in ACTIONS:
            raise UserError(f"{path}: restart {number}: action: expected one of {', '.join(ACTIONS)}, "
                            f"got {record.action!r}")
        records.append(record)
    return records


def append_restart(run_dir: RunDir, record: RestartRecord) -> None:
    """Add one record (the whole file is rewritten atomically)."""
    _write(run_dir, [*read_restarts(run_dir), record])


def update_restart(run_dir: RunDir, index: int, **changes) -> RestartRecord:
    """Fill in fields of record `index` known only later (restart_seconds, seconds_lost)."""
    records = read_restarts(run_dir)
    records[index] = replace(records[index], **changes)
    _write(run_dir, records)
    return records[index]


def _write(run_dir: RunDir, records: list[RestartRecord]) -> None:
    atomic_write_json(run_dir.restarts, {"restarts": [asdict(r) for r in records]})

"""metrics.jsonl records as a tracker's items (step, metrics, tags), each with the key that marks it sent.

A train / valid record is one step's figures under `train/...` / `valid/...`, with `train/attempt`: steps redone
after a restart from an older checkpoint or a guard rewind carry a higher attempt than the abandoned ones
(metrics.jsonl's `attempt` field and `attempt` event), so a tracker holds both, told apart, never mixed.
Stage starts and ends, guard events, attempts and the run's outcome become tags (and a metric at their step).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

# Events that are bookkeeping of the file itself or repeat every few steps: not tags.
QUIET_EVENTS = ("metrics_format", "checkpoint", "startup", "resume_note")
OUTCOMES = ("finished", "stopped", "guard_stopped")
TAG_VALUE_CHARS = 500


@dataclass
class Item:
    key: str
    """What the sent-ledger records (launcher/tracking/remote.py): kind, attempt and step, or an event's time."""
    step: int
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    time_ms: int = 0


def record_key(record: dict) -> str | None:
    kind = record.get("kind")
    if kind in ("train", "valid"):
        return f"{kind}:{record.get('attempt', 0)}:{record.get('step')}"
    if kind == "event" and record.get("event") not in (None, "metrics_format"):
        return f"event:{record['event']}:{record.get('time')!r}"
    return None


def to_item(record: dict, stage_ends: list[int]) -> Item | None:
    """The tracker item of one metrics.jsonl record (None: nothing to send)."""
    key = record_key(record)
    if key is None:
        return None
    kind, step = record["kind"], int(record.get("step") or 0)
    item = Item(key, step, time_ms=int(1000 * float(record.get("time") or 0)))
    if kind in ("train", "valid"):
        for name, value in record.items():
            if name in ("kind", "step", "time"):
                continue
            if isinstance(value, dict):
                item.metrics.update({f"{kind}/{name}/{k}": float(v) for k, v in value.items() if _number(v)})
            elif _number(value):
                item.metrics[f"{kind}/{name}"] = float(value)
        item.metrics[f"{kind}/attempt"] = float(record.get("attempt", 0))
        stage = record.get("stage")
        if kind == "train" and isinstance(stage, int) and stage < len(stage_ends) and step == stage_ends[stage]:
            item.tags[f"stage.{stage}.end_step"] = str(step)
        return item
    event = record["event"]
    if "seconds" in record and _number(record["seconds"]):
        item.metrics[f"timing/{event}_s"] = float(record["seconds"])
    if event in QUIET_EVENTS:
        return item if item.metrics else None
    if event == "stage_start":
        i = record.get("stage")
        # A resume mid-stage sets its stage up again (another stage_start): the tag keeps the stage's own start.
        first = (stage_ends[i - 1] if i else 0) if isinstance(i, int) and i < len(stage_ends) else step
        item.tags.update({f"stage.{i}.name": str(record.get("name")), f"stage.{i}.start_step": str(first),
                          f"stage.{i}.max_seq_len": str(record.get("max_seq_len")),
                          f"stage.{i}.global_batch_size": str(record.get("global_batch_size"))})
        item.metrics["schedule/stage_start"] = float(i or 0)
    elif event == "guard":
        action = record.get("action", "event")
        item.metrics[f"guard/{action}"] = 1.0
        item.tags[f"guard.step{step}.{action}"] = _short(record.get("message") or record.get("cause") or action)
    elif event == "attempt":
        item.metrics["attempt"] = float(record.get("attempt", 0))
        item.tags[f"attempt.{record.get('attempt')}"] = _short(
            f"{record.get('cause')}: steps after {step} redone (attempt {record.get('attempt')})")
    elif event in OUTCOMES:
        item.tags.update({"outcome": event, "outcome.step": str(step)})
    elif event == "resume":
        item.tags[f"resume.step{step}"] = _short(str(record.get("tag")))
    else:
        fields = {k: v for k, v in record.items() if k not in ("kind", "event", "time", "step")}
        item.tags[f"event.{event}"] = _short(json.dumps(fields, default=str))
    return item


def eval_items(evals_dir: Path) -> list[Item]:
    """Stage-end evaluations (RUN_DIR/evals/<tag>.<eval>.json), their numbers as eval/<eval>/... at their step."""
    items = []
    for path in sorted(Path(evals_dir).glob("*.json")) if Path(evals_dir).is_dir() else []:
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # still being written by the eval job: the next sync gets it
        if not isinstance(report, dict) or "step" not in report:
            continue
        name = str(report.get("eval", path.stem))
        item = Item(f"eval:{path.name}:{path.stat().st_mtime_ns}", int(report["step"]),
                    time_ms=int(path.stat().st_mtime * 1000))
        for key, value in flatten(report, f"eval/{name}", sep="/").items():
            if _number(value):
                item.metrics[key] = float(value)
        if "error" in report:
            item.tags[f"eval.{name}.error"] = _short(str(report["error"]))
        items.append(item)
    return items


def flatten(value, prefix: str = "", sep: str = ".") -> dict:
    """{'a.b': 1, 'c.0': 'x'} from {'a': {'b': 1}, 'c': ['x']}."""
    out = {}
    if isinstance(value, dict):
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}{sep}{k}" if prefix else str(k), sep))
    elif isinstance(value, (list, tuple)) and value and all(isinstance(v, (dict, list, tuple)) for v in value):
        for i, v in enumerate(value):
            out.update(flatten(v, f"{prefix}{sep}{i}", sep))
    else:
        out[prefix] = value
    return out


def run_params(config_dict: dict) -> dict[str, str]:
    """The resolved run config as flat parameters (values as text, long ones cut)."""
    return {k: _short(v if isinstance(v, str) else json.dumps(v, default=str)) for k, v in flatten(config_dict).items()}


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value and abs(value) != float("inf")


def _short(text: str) -> str:
    text = str(text)
    return text if len(text) <= TAG_VALUE_CHARS else text[:TAG_VALUE_CHARS - 3] + "..."

"""The run's record files and their versions: what config each part of the run was trained under.

A run writes version 1 of config.yaml, ds_config.resolved.json and stages.json; an accepted resume whose
records differ writes version N+1 of the files that differ only (config.2.yaml ...), never replacing the
originals, and config_versions.json lists each version with the step it took effect at. Readers ask for
the files in effect when a checkpoint was written (`files_in_effect`). A run directory without the index
reads as one version 1.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from launcher.common.errors import UserError
from launcher.common.io import atomic_write_json, atomic_write_text
from launcher.run_dir.layout import RunDir, versioned

KINDS = ("config", "ds_config", "stages")
"""The record kinds; each is a RunDir property naming its version-1 file."""


@dataclass
class RecordVersion:
    """One entry of config_versions.json."""

    version: int
    from_step: int
    """First step trained under it: checkpoints after this step were written under this version."""
    resumed_from: str | None
    """Checkpoint tag the run resumed from when this version took effect (None: a fresh start)."""
    files: dict
    """kind -> file name in RUN_DIR in effect from `from_step` (unchanged kinds keep the older file)."""
    recorded_at: str = ""


def read_versions(run_dir: RunDir) -> list[RecordVersion]:
    """The versions, oldest first ([] before a run's first start)."""
    path = run_dir.config_versions
    if not path.is_file():
        if not run_dir.config.is_file():
            return []
        return [RecordVersion(1, 0, None, {kind: getattr(run_dir, kind).name for kind in KINDS})]
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))["versions"]
        versions = [RecordVersion(**entry) for entry in entries]
    except (ValueError, KeyError, TypeError) as err:
        raise UserError(f"{path}: not a config version index ({type(err).__name__}: {err})") from None
    if not versions:
        raise UserError(f"{path}: lists no version")
    return versions


def files_in_effect(run_dir: RunDir, step: int) -> dict[str, Path]:
    """kind -> path of the record in effect when the checkpoint of `step` was written (the latest
    version that took effect before that step; version 1 for a run without versions)."""
    versions = read_versions(run_dir)
    chosen = versions[0] if versions else RecordVersion(1, 0, None, {kind: getattr(run_dir, kind).name
                                                                     for kind in KINDS})
    for version in versions[1:]:
        if version.from_step < step:
            chosen = version
    return {kind: run_dir.root / name for kind, name in chosen.files.items()}


def record_start(run_dir: RunDir, records: dict[str, dict], step: int, resumed_from: str | None) -> RecordVersion | None:
    """Write the records of a start that was accepted: version 1 on a run's first start, otherwise a
    new version of each kind whose content differs from the one in effect. Returns the new version
    (None when nothing differed)."""
    versions = read_versions(run_dir)
    number = versions[-1].version + 1 if versions else 1
    current = versions[-1].files if versions else {}
    records = {kind: _round_trip(kind, content) for kind, content in records.items()}
    changed = [kind for kind in KINDS if kind not in current or _load(run_dir.root / current[kind]) != records[kind]]
    if not changed:
        return None
    files = dict(current)
    for kind in changed:
        path = versioned(getattr(run_dir, kind), number)
        atomic_write_text(path, _render(kind, records[kind], number, step, resumed_from))
        files[kind] = path.name
    version = RecordVersion(number, step, resumed_from, files, time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    atomic_write_json(run_dir.config_versions, {"versions": [asdict(v) for v in [*versions, version]]})
    return version


def describe_change(run_dir: RunDir, version: RecordVersion) -> str:
    """One line for the console: which records changed and from which step they apply."""
    new = [name for kind, name in version.files.items()
           if version.version == 1 or name == versioned(getattr(run_dir, kind), version.version).name]
    return (f"the config differs from the run's records; recorded as {', '.join(new)} (version {version.version}, "
            f"in effect from step {version.from_step}; earlier versions unchanged, see {run_dir.config_versions.name})")


def _render(kind: str, content: dict, number: int, step: int, resumed_from: str | None) -> str:
    if kind == "config":
        header = "" if number == 1 else (f"# version {number} of this run's config, in effect from step {step} "
                                         f"(resumed from {resumed_from}); config.yaml is version 1\n")
        return header + yaml.safe_dump(content, sort_keys=False)
    return json.dumps(content, indent=2) + "\n"


def _round_trip(kind: str, content: dict) -> object:
    """`content` as it reads back from its file (tuples become lists, ...), for comparing."""
    return yaml.safe_load(yaml.safe_dump(content)) if kind == "config" else json.loads(json.dumps(content))


def _load(path: Path) -> object:
    """A record's content, or None when it is missing or unreadable (then it counts as changed)."""
    try:
        text = path.read_text(encoding="utf-8")
        return yaml.safe_load(text) if path.suffix == ".yaml" else json.loads(text)
    except (OSError, ValueError, yaml.YAMLError):
        return None


# ----------------------------------------------------------------------------------------------- init_from
INIT_FROM_RECORD = "init_from.json"
"""RUN_DIR/init_from.json: where a run with `init_from` started (launcher.train.init_weights.InitRecord:
path, weights_file, weights_sha256, architectures, mlm_head, tokenizer_sha256, model_type, dropped, fresh).
Written once, by rank 0
of the fresh start; absent for runs that started from random weights."""


def write_init_record(run_dir: RunDir, record: dict) -> None:
    atomic_write_json(run_dir.root / INIT_FROM_RECORD, record)


def read_init_record(run_dir: RunDir) -> dict | None:
    """The record, None when the run started from random weights (or the file is unreadable: readers
    such as the report and the model card then say nothing about it)."""
    record = _load(run_dir.root / INIT_FROM_RECORD)
    return record if isinstance(record, dict) and "path" in record else None


def describe_init(record: dict | None) -> str | None:
    """One line: `DIR (weights model.safetensors sha256 ab12..., MLM head loaded)`."""
    if not record:
        return None
    sha = str(record.get("weights_sha256", ""))
    line = (f"{record['path']} ({record.get('weights_file', 'weights')} sha256 {sha}, "
            f"MLM head {record.get('mlm_head', 'loaded')})")
    if record.get("model_type", "roformer") == "roformer":
        return line
    dropped, fresh = record.get("dropped") or [], record.get("fresh") or []
    return (f"{line}, a {record['model_type']}: dropped {', '.join(dropped) or 'nothing'}; initialised fresh "
            f"{', '.join(fresh) or 'nothing'}")


# --------------------------------------------------------------------------------------------- branch_from
BRANCH_FROM_RECORD = "branch_from.json"
"""RUN_DIR/branch_from.json: where a branch (`branch_from`, launcher/config/branch_from.py) started:
source_run_dir, tag, step, stage, sidecar_sha256 (of the source checkpoint's sidecar.json, which records the
sha256 of each of its files), source_config and source_stages (the source's records in effect at that step).
Written once, by rank 0 of the branch's first start; absent for runs that are no branch."""


def write_branch_record(run_dir: RunDir, record: dict) -> None:
    atomic_write_json(run_dir.root / BRANCH_FROM_RECORD, record)


def read_branch_record(run_dir: RunDir) -> dict | None:
    """The record, None when the run is no branch (or the file is unreadable: readers then say nothing)."""
    record = _load(run_dir.root / BRANCH_FROM_RECORD)
    return record if isinstance(record, dict) and "source_run_dir" in record else None


def describe_branch(record: dict | None) -> str | None:
    """One line: `a branch of RUN_DIR at global_step12 (step 12, stage 'long', sidecar.json sha256 ab12...)`."""
    if not record:
        return None
    return (f"a branch of {record['source_run_dir']} at {record.get('tag')} (step {record.get('step')}, stage "
            f"'{record.get('stage')}', sidecar.json sha256 {record.get('sidecar_sha256')})")


def describe_start(run_dir: RunDir) -> str | None:
    """Where the run's weights started, in one line: a branch's source or init_from's model (None: random)."""
    return describe_branch(read_branch_record(run_dir)) or describe_init(read_init_record(run_dir))


def stage_ends(rows: list[dict]) -> list[int]:
    """The end step of each stage of the schedule (by stage index) from its stages.json rows (a batch ramp's
    pieces are rows of one index: the last one's end is the stage's)."""
    ends: dict[int, int] = {}
    for row in rows:
        ends[int(row["index"])] = int(row["first_step"]) + int(row["steps"])
    return [ends[i] for i in sorted(ends)]

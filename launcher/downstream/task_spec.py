"""What a fine-tuning task is: its files, columns, task type and optional fine-tune settings.

One `TaskSpec` describes every task `roformer finetune` runs: a user's own files (command-line flags, or
a YAML file given to `--task-spec FILE` and to `logging.stage_end_evals`) and the bundled tasks
(launcher.downstream.tasks). The YAML keys, retrieval's included: docs/finetune.md, "Task spec files".
The files themselves are read and checked by launcher.downstream.labelled_files.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from launcher.common.errors import UserError
from launcher.common.io import read_mapping

TASK_TYPES = ("classification", "regression", "retrieval")
FILE_FIELDS = ("train", "dev", "test")
EXTRA_FILE_FIELDS = ("corpus",)  # read by retrieval tasks only
# Fine-tune settings a task spec may carry (FinetuneConfig fields), with their type.
SETTINGS = {"max_length": int, "epochs": int, "lr": float, "batch_size": int, "select_metric": str}


@dataclass(frozen=True)
class TaskSpec:
    """One labelled task. Errors about it name the field (and the YAML file, when there is one)."""

    name: str
    """How reports, the console table and stage-end eval files name the task."""
    train: Path
    """Labelled training file: .csv, .tsv, .jsonl/.json or .parquet."""
    dev: Path | None = None
    """Model-selection file; None only with `dev_fraction`."""
    test: Path | None = None
    """Held-out file; None: the dev split is reported as the held-out split."""
    dev_fraction: float | None = None
    """Share of train held out as dev (a fixed seeded split, the same for every seed) when `dev` is None."""
    text_column: str = "text"
    text_pair_column: str | None = None
    """Second text of text-pair tasks (encoded as `[CLS] a [SEP] b [SEP]`)."""
    label_column: str = "label"
    task_type: str | None = None
    """"classification", "regression", "retrieval" or None: inferred from train's label column (floats:
    regression; retrieval is never inferred)."""
    label_names: tuple[str, ...] | None = None
    """Names of integer labels 0..k-1 (the bundled tasks); None: the labels themselves name the classes."""
    negative_column: str | None = None
    """Retrieval: a hard-negative passage per row (required non-empty in train; in dev/test, when the
    file has the column, its passages join the ranking pool)."""
    corpus: Path | None = None
    """Retrieval: a file of extra passages every dev/test query is also ranked against."""
    corpus_text_column: str = "text"
    """Retrieval: the corpus file's passage column."""
    settings: dict = dataclasses.field(default_factory=dict)
    """Fine-tune settings of this task (keys of SETTINGS); the command line's explicit values win."""
    source: Path | None = None
    """The YAML file it was read from, if any (named in errors)."""

    def __post_init__(self) -> None:
        where = f"{self.source}: " if self.source else ""
        if self.task_type is not None and self.task_type not in TASK_TYPES:
            raise UserError(f"{where}task_type: {self.task_type!r} is not one of {', '.join(TASK_TYPES)}")
        if self.dev is None and self.dev_fraction is None:
            raise UserError(f"{where}no dev file: give one (--dev / dev:) or an explicit --dev-fraction / "
                            "dev_fraction: to hold out part of train")
        if self.dev is not None and self.dev_fraction is not None:
            raise UserError(f"{where}dev and dev_fraction both given: use one")
        if self.dev_fraction is not None and not (isinstance(self.dev_fraction, (int, float))
                                                  and 0 < self.dev_fraction < 1):
            raise UserError(f"{where}dev_fraction: must be a number between 0 and 1, got {self.dev_fraction!r}")
        for field in ("text_column", "label_column"):
            if not isinstance(getattr(self, field), str) or not getattr(self, field):
                raise UserError(f"{where}{field}: must be a non-empty column name")
        if self.text_pair_column is not None and self.text_pair_column == self.text_column:
            raise UserError(f"{where}text_pair_column: same column as text_column ({self.text_column!r})")
        retrieval_only = [f for f in ("negative_column", "corpus") if getattr(self, f) is not None]
        if self.task_type != "retrieval" and retrieval_only:
            raise UserError(f"{where}{retrieval_only[0]}: only for task_type retrieval")
        if self.task_type == "retrieval":
            if self.text_pair_column is None:
                raise UserError(f"{where}text_pair_column: a retrieval task needs the passage column "
                                "(--text-pair-column / text_pair_column:)")
            if self.negative_column in (self.text_column, self.text_pair_column):
                raise UserError(f"{where}negative_column: same column as the query or passage column "
                                f"({self.negative_column!r})")

    @property
    def files(self) -> dict[str, Path]:
        """The splits that have a file, in train/dev/test order."""
        return {split: getattr(self, split) for split in FILE_FIELDS if getattr(self, split) is not None}


def load_task_spec(path: Path) -> TaskSpec:
    """A TaskSpec from a YAML file; every error names the file and the field."""
    path = Path(path)
    raw = read_mapping(path, "task spec")
    known = {f.name for f in dataclasses.fields(TaskSpec)} - {"settings", "source"} | set(SETTINGS)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise UserError(f"{path}: unknown field {unknown[0]!r} (known: {', '.join(sorted(known))})")
    if "train" not in raw:
        raise UserError(f"{path}: field 'train' missing (the labelled training file)")
    values: dict = {"name": str(raw.get("name") or path.stem), "source": path}
    for field in FILE_FIELDS + EXTRA_FILE_FIELDS:
        if raw.get(field) is not None:
            if not isinstance(raw[field], str):
                raise UserError(f"{path}: {field}: expected a file path, got {raw[field]!r}")
            file = Path(raw[field]).expanduser()
            values[field] = file if file.is_absolute() else path.parent / file
    for field in ("text_column", "text_pair_column", "label_column", "task_type", "dev_fraction", "negative_column",
                  "corpus_text_column"):
        if field in raw:
            values[field] = raw[field]
    if raw.get("label_names") is not None:
        names = raw["label_names"]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise UserError(f"{path}: label_names: expected a list of strings")
        values["label_names"] = tuple(names)
    values["settings"] = {key: _setting(path, key, raw[key]) for key in SETTINGS if raw.get(key) is not None}
    return TaskSpec(**values)


def _setting(path: Path, key: str, value):
    kind = SETTINGS[key]
    if kind is str:
        if not isinstance(value, str):
            raise UserError(f"{path}: {key}: expected a string, got {value!r}")
        return value
    try:  # YAML reads "1e-3" as a string
        number = kind(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        number = None
    if number is None or (kind is int and number != value and not (isinstance(value, str) and value.isdigit())) \
            or (kind is float and not math.isfinite(number)):
        raise UserError(f"{path}: {key}: expected {'an integer' if kind is int else 'a number'}, got {value!r}")
    return number

"""A TaskSpec's labelled files, read through `datasets` and checked before any compute.

Formats by extension (FORMATS): .csv, .tsv, .jsonl / .json, .parquet. Every problem is one UserError naming
the file, the row (1 = the first record) and the column. Classification labels are the sorted set of
train's labels (integers as numbers), or the spec's `label_names` for integer labels 0..k-1.
"""
from __future__ import annotations

import csv
import math
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path

from launcher.downstream.task_spec import TaskSpec
from launcher.common.errors import UserError
from launcher.common.io import not_utf8

# extension -> (datasets builder, its options)
FORMATS = {".csv": ("csv", {"keep_default_na": False}),
           ".tsv": ("csv", {"delimiter": "\t", "quoting": csv.QUOTE_NONE, "keep_default_na": False}),
           ".jsonl": ("json", {}), ".json": ("json", {}), ".parquet": ("parquet", {})}
DEV_SPLIT_SEED = 0  # a --dev-fraction split is the same for every --seeds entry


@dataclass
class Split:
    """One split's examples, in file order."""

    name: str  # "train", "dev" or "test"
    path: Path
    rows: list[int]  # 1-based record number in `path` of each example
    texts: list[str]
    pairs: list[str] | None  # second texts of text-pair tasks
    labels: list  # class ids (classification) or floats (regression)

    def __len__(self) -> int:
        return len(self.texts)

    def subset(self, indices: list[int]) -> "Split":
        pick = lambda values: [values[i] for i in indices]  # noqa: E731
        return Split(self.name, self.path, pick(self.rows), pick(self.texts),
                     pick(self.pairs) if self.pairs is not None else None, pick(self.labels))


@dataclass
class TaskData:
    """A task's checked splits and what its labels mean."""

    spec: TaskSpec
    task_type: str  # "classification" or "regression"
    label_names: list[str] | None  # class id -> name (None for regression)
    train: Split
    dev: Split
    test: Split | None

    @property
    def num_labels(self) -> int:
        return 1 if self.label_names is None else len(self.label_names)

    @property
    def held_out(self) -> Split:
        """The split reported as held out: test, or dev when there is no test file."""
        return self.test if self.test is not None else self.dev


def read_table(path: Path) -> dict[str, list]:
    """Column name -> values of a labelled file (datasets' readers; no hand-written parser)."""
    path = Path(path)
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise UserError(f"{path}: unknown extension {path.suffix or '(none)'!r} (use {', '.join(FORMATS)})")
    if not path.exists():
        raise UserError(f"{path}: file not found")
    if path.is_dir():
        raise UserError(f"{path}: a directory; give the labelled file itself")
    if not path.is_file():
        raise UserError(f"{path}: not a regular file (a FIFO, socket or device); give a file, it is read twice")
    if fmt[0] != "parquet" and (where := not_utf8(path)):  # datasets would say only 'UnicodeDecodeError'
        raise UserError(f"{path}: {where}; save it as UTF-8")
    if fmt[0] == "csv":
        _refuse_duplicate_header(path, fmt[1].get("delimiter", ","))
    import datasets

    datasets.disable_progress_bars()
    builder, options = fmt
    verbosity = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its reader logs the error we raise anyway
    # A private cache that is deleted again: reading a user's file leaves nothing behind.
    with tempfile.TemporaryDirectory(prefix="roformer-finetune-read-") as cache:
        try:
            table = datasets.load_dataset(builder, data_files=str(path), split="train", cache_dir=cache,
                                          keep_in_memory=True, **options)
        except Exception as err:  # noqa: BLE001  any reader error is the file's fault: name it, one line
            if "corresponds to no data" in _root_cause(err):  # datasets' words for a header-only file
                raise UserError(f"{path}: no rows") from None
            raise UserError(f"{path}: does not parse as {path.suffix.lower()[1:]}: "
                            f"{_bad_json_line(path) or _root_cause(err)}") from None
        finally:
            datasets.logging.set_verbosity(verbosity)
        return table.to_dict()


def _refuse_duplicate_header(path: Path, delimiter: str) -> None:
    """pandas renames a second `label` column `label.1`: the file's columns would not be the ones it names."""
    with path.open(encoding="utf-8", newline="") as handle:
        header = next(csv.reader(handle, delimiter=delimiter), [])
    seen: set[str] = set()
    for name in header:
        if name in seen:
            raise UserError(f"{path}: line 1: column {name!r} named twice in the header; rename one")
        seen.add(name)


def _bad_json_line(path: Path) -> str | None:
    """Where a JSON-lines file breaks (datasets' error names no line): the first line json rejects."""
    import json

    if path.suffix.lower() != ".jsonl":
        return None
    with path.open(encoding="utf-8", errors="replace") as f:
        for line_no, line in enumerate(f, start=1):
            try:
                line.strip() and json.loads(line)
            except ValueError as err:
                return f"line {line_no}: {err}"
    return None


def _root_cause(err: BaseException) -> str:
    while err.__cause__ is not None or err.__context__ is not None:
        err = err.__cause__ or err.__context__
    lines = str(err).strip().splitlines()
    return (lines[0] if lines else type(err).__name__)[:300]


def load_task(spec: TaskSpec) -> TaskData:
    """Read and check every file of `spec`; the label mapping and task type come from train.
    (Retrieval tasks are read by launcher.downstream.retrieval_data.)"""
    tables = {split: (path, read_table(path)) for split, path in spec.files.items()}
    train_path, train_table = tables["train"]
    label_values = _column(train_path, train_table, spec.label_column)
    task_type = _task_type(spec, train_path, label_values)
    texts = {split: _texts(path, table, spec) for split, (path, table) in tables.items()}

    if task_type == "regression":
        labels = {split: _numbers(path, spec.label_column, _column(path, table, spec.label_column))
                  for split, (path, table) in tables.items()}
        label_names, to_id = None, None
    else:
        keys = _class_keys(spec, train_path, label_values)
        label_names = _label_names(spec, train_path, keys)
        to_id = {key: i for i, key in enumerate(keys)} if spec.label_names is None else \
            {i: i for i in range(len(spec.label_names))}
        labels = {split: _class_ids(path, spec.label_column, _column(path, table, spec.label_column), to_id, train_path)
                  for split, (path, table) in tables.items()}
        if len(set(labels["train"])) < 2:
            raise UserError(f"{train_path}: column {spec.label_column!r}: only one class "
                            f"({label_names[labels['train'][0]]!r}) in train; classification needs two or more")

    splits = {split: Split(split, path, list(range(1, len(labels[split]) + 1)), texts[split][0], texts[split][1],
                           labels[split]) for split, (path, _) in tables.items()}
    if spec.dev is None:
        splits["train"], splits["dev"] = _hold_out(splits["train"], spec.dev_fraction)
    return TaskData(spec=spec, task_type=task_type, label_names=label_names, train=splits["train"],
                    dev=splits["dev"], test=splits.get("test"))


def _column(path: Path, table: dict, column: str) -> list:
    if column not in table:
        raise UserError(f"{path}: no column {column!r} (the file's columns: {', '.join(map(repr, table)) or 'none'})")
    values = table[column]
    if not values:
        raise UserError(f"{path}: no rows")
    for row, value in enumerate(values, start=1):
        if isinstance(value, (dict, list)):
            raise UserError(f"{path}: row {row}, column {column!r}: a {'mapping' if isinstance(value, dict) else 'list'}"
                            f" ({str(value)[:60]}), not a single text or label")
    return values


def _texts(path: Path, table: dict, spec: TaskSpec) -> tuple[list[str], list[str] | None]:
    columns = [spec.text_column] + ([spec.text_pair_column] if spec.text_pair_column else [])
    result = [text_column(path, table, column) for column in columns]
    return result[0], (result[1] if len(result) > 1 else None)


def text_column(path: Path, table: dict, column: str) -> list[str]:
    """A text column of a file read by read_table: the column must exist and every value be a non-empty
    text (errors name the file, row and column)."""
    values = _column(path, table, column)
    for row, value in enumerate(values, start=1):
        if value is None or (isinstance(value, float) and math.isnan(value)) or not str(value).strip():
            raise UserError(f"{path}: row {row}, column {column!r}: empty or missing text")
    return [value if isinstance(value, str) else str(value) for value in values]


def _is_float_column(values: list) -> bool:
    """Floating-point labels (as the file's reader typed them: 0.5, 3.0): regression, as in run_glue.py."""
    numbers = [v for v in values if v is not None]
    return bool(numbers) and all(isinstance(v, float) for v in numbers)


def _task_type(spec: TaskSpec, path: Path, labels: list) -> str:
    floats = _is_float_column(labels)
    if spec.task_type is None:
        if not floats:
            _refuse_broken_numbers(spec, path, labels)
        return "regression" if floats else "classification"
    fractional = [i for i, v in enumerate(labels, start=1) if isinstance(v, float) and not v.is_integer()]
    if spec.task_type == "classification" and floats and fractional:
        row = fractional[0]
        raise UserError(f"{path}: row {row}, column {spec.label_column!r}: {labels[row - 1]!r} is a fractional "
                        "number, but the task type is classification (use --task-type regression, or whole/string labels)")
    return spec.task_type


def _as_number(value) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _refuse_broken_numbers(spec: TaskSpec, path: Path, labels: list) -> None:
    """Fractional numbers with a few that are not ("N/A", "nan", a word) would silently become classes
    named "1.5", "2.5", "nan": the row that breaks the numeric column is named instead."""
    numbers = [_as_number(v) for v in labels]
    fractional = any(n is not None and not n.is_integer() for n in numbers)
    broken = [row for row, n in enumerate(numbers, start=1) if n is None]
    if fractional and broken and len(broken) < len(labels):
        row = broken[0]
        raise UserError(f"{path}: row {row}, column {spec.label_column!r}: {labels[row - 1]!r} is not a number, but "
                        f"the column's other labels are fractional numbers (regression); fix the row, or give "
                        f"--task-type classification")


def _numbers(path: Path, column: str, values: list) -> list[float]:
    numbers = []
    for row, value in enumerate(values, start=1):
        try:
            number = float(value) if not isinstance(value, bool) and value is not None and value != "" else None
        except (TypeError, ValueError):
            number = None
        if number is None or not math.isfinite(number):
            raise UserError(f"{path}: row {row}, column {column!r}: {value!r} is not a number "
                            "(regression labels must be numeric)")
        numbers.append(number)
    return numbers


def _key(value):
    """A classification label as a mapping key: whole numbers as int (1, 1.0 and "1" are one class when
    train's labels are numbers), anything else as its string."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)) and float(value).is_integer():
        return int(value)
    return value if isinstance(value, str) else str(value)


def _class_keys(spec: TaskSpec, path: Path, values: list) -> list:
    for row, value in enumerate(values, start=1):
        if value is None or (isinstance(value, str) and not value.strip()):
            raise UserError(f"{path}: row {row}, column {spec.label_column!r}: empty or missing label")
    keys = {_key(v) for v in values}
    numeric = all(isinstance(k, int) for k in keys)
    return sorted(keys) if numeric else sorted(str(k) for k in keys)


def _label_names(spec: TaskSpec, path: Path, keys: list) -> list[str]:
    if spec.label_names is None:
        return [str(k) for k in keys]
    bad = [k for k in keys if not (isinstance(k, int) and 0 <= k < len(spec.label_names))]
    if bad:
        raise UserError(f"{path}: column {spec.label_column!r}: label {bad[0]!r} is not an integer in "
                        f"[0, {len(spec.label_names)}) (the task's label_names: {', '.join(spec.label_names)})")
    return list(spec.label_names)


def _class_ids(path: Path, column: str, values: list, to_id: dict, train_path: Path) -> list[int]:
    numeric = all(isinstance(k, int) for k in to_id)
    ids = []
    for row, value in enumerate(values, start=1):
        key = _key(value)
        if numeric and isinstance(key, str):
            try:
                key = _key(float(key))
            except ValueError:
                pass
        elif not numeric:
            key = str(key)
        if value is None or (isinstance(value, str) and not value.strip()):
            raise UserError(f"{path}: row {row}, column {column!r}: empty or missing label")
        if key not in to_id:
            known = ", ".join(repr(k) for k in to_id)
            raise UserError(f"{path}: row {row}, column {column!r}: label {value!r} never seen in train "
                            f"({train_path} has: {known})")
        ids.append(to_id[key])
    return ids


def _hold_out(train: Split, fraction: float) -> tuple[Split, Split]:
    """(rest of train, dev): a fixed seeded share of train's rows; row numbers keep pointing into the train file."""
    order = list(range(len(train)))
    random.Random(DEV_SPLIT_SEED).shuffle(order)
    count = max(1, round(fraction * len(train)))
    if count >= len(train):
        raise UserError(f"{train.path}: dev_fraction {fraction} leaves no training rows ({len(train)} rows)")
    dev, rest = sorted(order[:count]), sorted(order[count:])
    held = train.subset(dev)
    held.name = "dev"
    return train.subset(rest), held

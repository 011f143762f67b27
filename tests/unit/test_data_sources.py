"""Bundled corpora of the reproduction's recipe: WordNet glosses and the tasks' TRAINING text only."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_pipeline.errors import DataError
from data_pipeline.sources import (
    MOVIE_GROUPINGS,
    MOVIE_SENTENCES_PER_DOCUMENT,
    TASK_TEXT_DIR,
    default_corpus_files,
    install_task_text,
    wordnet_documents,
)


def _write_task(root: Path, name: str, splits: dict[str, list[str]]) -> None:
    (root / name).mkdir(parents=True)
    for split, texts in splits.items():
        lines = [json.dumps({"text": t, "label": 0}) for t in texts]
        (root / name / f"{split}.jsonl").write_text("\n".join(lines) + "\n")


def _texts(path: Path) -> list[str]:
    return [json.loads(line)["text"] for line in path.read_text().splitlines()]


def test_task_text_is_the_training_split_only(tmp_path):
    tasks = tmp_path / "tasks"
    movies = [f"train sentence {i}" for i in range(40)]
    _write_task(tasks, "movie-reviews", {"train": movies, "dev": ["DEV-MOVIE"], "test": ["TEST-MOVIE"]})
    _write_task(tasks, "inews", {"train": ["news one", "news two"], "dev": ["DEV-NEWS"], "test": ["TEST-NEWS"]})
    install_task_text(tmp_path / "corpora", tasks_dir=tasks)

    out = tmp_path / "corpora" / TASK_TEXT_DIR
    movie_docs, news_docs = _texts(out / "movie-reviews.jsonl"), _texts(out / "inews.jsonl")
    everything = "\n".join(movie_docs + news_docs)
    assert not any(word in everything for word in ("DEV-", "TEST-"))
    assert news_docs == ["news one", "news two"]
    # Each grouping holds every training sentence once; groupings differ (no exact duplicate documents).
    per_grouping = -(-len(movies) // MOVIE_SENTENCES_PER_DOCUMENT)
    assert len(movie_docs) == MOVIE_GROUPINGS * per_grouping
    sentences = [s for doc in movie_docs for s in doc.split("\n")]
    assert sorted(sentences) == sorted(movies * MOVIE_GROUPINGS)
    assert len(set(movie_docs)) == len(movie_docs)
    # Listed by name for `roformer data prepare --default-corpus task-train`.
    assert default_corpus_files(tmp_path, ("task-train",)) == sorted(out.glob("*.jsonl"))


def test_task_text_needs_the_converted_tasks(tmp_path):
    with pytest.raises(DataError, match="train.jsonl: missing"):
        install_task_text(tmp_path / "corpora", tasks_dir=tmp_path / "no-tasks")


def test_unknown_corpus_name_is_named(tmp_path):
    with pytest.raises(DataError, match="unknown corpus 'fr'.*wordnet"):
        default_corpus_files(tmp_path, ("fr",))


def test_wordnet_glosses_become_grouped_documents(tmp_path):
    header = "  1 This software and database is being provided to you, the LICENSEE, by\n"
    synset = ("00001740 03 n 02 entity 0 thing 1 000 | that which is perceived or known; \"an entity\"\n")
    for pos in ("noun", "verb", "adj", "adv"):
        (tmp_path / f"data.{pos}").write_text(header + synset * 3)
    documents = wordnet_documents(tmp_path)
    assert len(documents) == 1  # 12 synsets, 20 per document
    assert documents[0].split("\n")[0] == 'entity, thing: that which is perceived or known; "an entity"'
    assert "LICENSEE" not in documents[0]

"""Every bad input of `roformer finetune --task-type retrieval`: one line naming the file, row and
column, exit code 2, and nothing written (--out, --save-model, --predictions). Real WordNet text; the
stored run's export (no DeepSpeed job)."""
from __future__ import annotations

import pytest

from tests.support.helpers import finetune_refused
from tests.support.labelled_data import wordnet_retrieval_rows, write_rows


@pytest.fixture(scope="module")
def rows():
    return wordnet_retrieval_rows("train", 10, words=0)


def _fails(capsys, export, tmp_path, flags) -> str:
    return finetune_refused(capsys, export, tmp_path, flags, predictions="top10.csv")


def _own(train, dev, *extra) -> list[str]:
    return ["--task-type", "retrieval", "--train", str(train), "--dev", str(dev), "--text-column", "question",
            "--text-pair-column", "answer", *extra]


def test_a_missing_query_or_passage_column_is_named(capsys, stored_export, rows, tmp_path):
    train = write_rows(tmp_path / "train.csv", rows)
    dev = write_rows(tmp_path / "dev.jsonl", [{"q": r["question"], "answer": r["answer"]} for r in rows])
    err = _fails(capsys, stored_export, tmp_path, _own(train, dev))
    assert f"{dev}: no column 'question' (the file's columns: 'q', 'answer')" in err
    dev = write_rows(tmp_path / "dev.parquet", [{"question": r["question"], "gloss": r["answer"]} for r in rows])
    err = _fails(capsys, stored_export, tmp_path, _own(train, dev))
    assert f"{dev}: no column 'answer' (the file's columns: 'question', 'gloss')" in err
    err = _fails(capsys, stored_export, tmp_path, _own(train, train, "--negative-column", "contrast"))
    assert f"{train}: no column 'contrast' (the file's columns: 'question', 'answer', 'wrong')" in err


@pytest.mark.parametrize("column", ["question", "answer"])
def test_an_empty_query_or_passage_is_named_by_row_and_column(capsys, stored_export, rows, tmp_path, column):
    broken = [dict(r) for r in rows]
    broken[3][column] = None if column == "answer" else "  "
    train = write_rows(tmp_path / "train.jsonl", broken)
    err = _fails(capsys, stored_export, tmp_path, _own(train, write_rows(tmp_path / "dev.csv", rows)))
    assert f"{train}: row 4, column '{column}': empty or missing text" in err


def test_a_split_with_fewer_than_two_passages_is_refused(capsys, stored_export, rows, tmp_path):
    train = write_rows(tmp_path / "train.csv", rows)
    dev = write_rows(tmp_path / "dev.csv", [{"question": r["question"], "answer": rows[0]["answer"]} for r in rows[:4]])
    err = _fails(capsys, stored_export, tmp_path, _own(train, dev))
    assert f"{dev}: dev split has 1 distinct passage (column 'answer'); ranking needs at least 2" in err


def test_a_query_and_passage_given_twice_is_named_with_both_rows(capsys, stored_export, rows, tmp_path):
    train = write_rows(tmp_path / "train.tsv", [*rows[:6], dict(rows[2], wrong=rows[7]["answer"]), *rows[6:]])
    err = _fails(capsys, stored_export, tmp_path, _own(train, write_rows(tmp_path / "dev.csv", rows)))
    assert f"{train}: row 7, columns 'question' and 'answer': the same query and passage as row 3" in err


def test_a_corpus_without_its_column_is_named(capsys, stored_export, rows, tmp_path):
    train, dev = write_rows(tmp_path / "train.csv", rows), write_rows(tmp_path / "dev.csv", rows)
    corpus = write_rows(tmp_path / "corpus.jsonl", [{"text": r["wrong"]} for r in rows])
    err = _fails(capsys, stored_export, tmp_path, _own(train, dev, "--corpus", str(corpus),
                                                      "--corpus-text-column", "gloss"))
    assert f"{corpus}: no column 'gloss' (the file's columns: 'text')" in err


def test_retrieval_flags_need_the_retrieval_type_and_a_passage_column(capsys, stored_export, rows, tmp_path):
    train = write_rows(tmp_path / "train.csv", rows)
    err = _fails(capsys, stored_export, tmp_path, ["--train", str(train), "--dev", str(train), "--text-column",
                                                   "question", "--negative-column", "wrong"])
    assert "negative_column: only for task_type retrieval" in err
    err = _fails(capsys, stored_export, tmp_path, ["--task-type", "retrieval", "--train", str(train), "--dev",
                                                   str(train), "--text-column", "question"])
    assert "text_pair_column: a retrieval task needs the passage column" in err
    err = _fails(capsys, stored_export, tmp_path, ["--train", str(train), "--dev", str(train), "--epochs", "0"])
    assert "--epochs: invalid value 0" in err  # zero-shot is for retrieval only

"""Every bad input of `roformer finetune` on own files: one line naming the file, row and column, exit
code 2, no traceback, and nothing written (--out, --save-model, --predictions). Real text from the
bundled movie reviews; the stored run's export (no DeepSpeed job)."""
from __future__ import annotations

import pytest

from launcher.cli import main as cli_main
from tests.support.helpers import finetune_refused
from tests.support.labelled_data import movie_review_rows, write_rows


@pytest.fixture(scope="module")
def rows(tasks_dir):
    return movie_review_rows(tasks_dir, "train", 12)


def _fails(capsys, export, tmp_path, flags) -> str:
    return finetune_refused(capsys, export, tmp_path, flags, predictions="predictions.csv")


def _own(train, dev, *extra) -> list[str]:
    return ["--train", str(train), "--dev", str(dev), *extra]


def test_a_missing_column_lists_the_files_columns(capsys, stored_export, rows, tmp_path):
    train = write_rows(tmp_path / "train.csv", rows)
    dev = write_rows(tmp_path / "dev.csv", [{"body": r["text"], "label": r["label"]} for r in rows])
    err = _fails(capsys, stored_export, tmp_path, _own(train, dev))
    assert f"{dev}: no column 'text' (the file's columns: 'body', 'label')" in err
    err = _fails(capsys, stored_export, tmp_path, _own(train, train, "--label-column", "polarity"))
    assert f"{train}: no column 'polarity' (the file's columns: 'text', 'label')" in err


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_an_empty_or_missing_text_is_named_by_row_and_column(capsys, stored_export, rows, tmp_path, suffix):
    broken = [dict(r) for r in rows]
    broken[2]["text"] = "   "
    train = write_rows(tmp_path / f"train{suffix}", broken)
    err = _fails(capsys, stored_export, tmp_path, _own(train, train))
    assert f"{train}: row 3, column 'text': empty or missing text" in err
    if suffix == ".jsonl":
        del broken[2]["text"]  # the key absent from one record
        write_rows(train, broken)
        assert f"{train}: row 3, column 'text': empty or missing text" in _fails(capsys, stored_export, tmp_path,
                                                                                  _own(train, train))


def test_a_dev_or_test_label_never_seen_in_train_is_named(capsys, stored_export, rows, tmp_path):
    train = write_rows(tmp_path / "train.csv", rows)
    odd = [dict(r) for r in rows]
    odd[4]["label"] = "neutral"
    test = write_rows(tmp_path / "test.tsv", odd)
    err = _fails(capsys, stored_export, tmp_path, _own(train, train, "--test", str(test)))
    assert f"{test}: row 5, column 'label': label 'neutral' never seen in train ({train} has: 'negative', 'positive')" \
        in err


def test_a_non_numeric_regression_label_is_named(capsys, stored_export, rows, tmp_path):
    scored = [{"text": r["text"], "score": 1.5 if r["label"] == "positive" else -0.5} for r in rows]
    scored[3]["score"] = "n/a"
    train = write_rows(tmp_path / "train.jsonl", scored)
    err = _fails(capsys, stored_export, tmp_path, _own(train, train, "--label-column", "score",
                                                       "--task-type", "regression"))
    assert f"{train}: row 4, column 'score': 'n/a' is not a number (regression labels must be numeric)" in err


def test_fractional_labels_with_an_explicit_classification_type_are_refused(capsys, stored_export, rows, tmp_path):
    scored = [{"text": r["text"], "score": 1.5 if r["label"] == "positive" else -0.5} for r in rows]
    train = write_rows(tmp_path / "train.csv", scored)
    err = _fails(capsys, stored_export, tmp_path, _own(train, train, "--label-column", "score",
                                                       "--task-type", "classification"))
    first = scored[0]["score"]
    assert f"{train}: row 1, column 'score': {first} is a fractional number, but the task type is classification" in err


def test_a_single_class_in_train_is_refused(capsys, stored_export, rows, tmp_path):
    train = write_rows(tmp_path / "train.parquet", [{"text": r["text"], "label": "positive"} for r in rows])
    err = _fails(capsys, stored_export, tmp_path, _own(train, train))
    assert f"{train}: column 'label': only one class ('positive') in train; classification needs two or more" in err


def test_a_file_that_does_not_parse_is_named(capsys, stored_export, rows, tmp_path):
    good = write_rows(tmp_path / "good.csv", rows)
    bad_csv = tmp_path / "bad.csv"
    bad_csv.write_text(good.read_text(encoding="utf-8") + "one,two,three\n", encoding="utf-8")
    err = _fails(capsys, stored_export, tmp_path, _own(good, bad_csv))
    assert f"{bad_csv}: does not parse as csv" in err and "line 14" in err
    bad_jsonl = tmp_path / "bad.jsonl"
    bad_jsonl.write_text('{"text": "fine", "label": "positive"}\n{"text": "cut off", "label": \n', encoding="utf-8")
    err = _fails(capsys, stored_export, tmp_path, _own(good, bad_jsonl))
    assert f"{bad_jsonl}: does not parse as jsonl: line 2:" in err
    bad_parquet = tmp_path / "bad.parquet"
    bad_parquet.write_bytes(b"PAR1 this is not a parquet file")
    assert f"{bad_parquet}: does not parse as parquet" in _fails(capsys, stored_export, tmp_path, _own(good, bad_parquet))


def test_an_unknown_extension_or_a_missing_file_is_named(capsys, stored_export, rows, tmp_path):
    good = write_rows(tmp_path / "train.csv", rows)
    sheet = tmp_path / "dev.xlsx"
    sheet.write_bytes(b"PK")
    err = _fails(capsys, stored_export, tmp_path, _own(good, sheet))
    assert f"{sheet}: unknown extension '.xlsx' (use .csv, .tsv, .jsonl, .json, .parquet)" in err
    assert f"{tmp_path / 'gone.csv'}: file not found" in _fails(capsys, stored_export, tmp_path,
                                                                _own(good, tmp_path / "gone.csv"))


def test_flag_combinations_are_refused_before_anything_is_read(capsys, stored_export, rows, tmp_path):
    train = write_rows(tmp_path / "train.csv", rows)
    assert "no dev file" in _fails(capsys, stored_export, tmp_path, ["--train", str(train)])
    assert "exactly one of --task NAME, --task-spec FILE or --train FILE (got --task and --train)" in \
        _fails(capsys, stored_export, tmp_path, ["--train", str(train), "--task", "inews"])
    assert "--text-column: only with --train" in _fails(capsys, stored_export, tmp_path,
                                                        ["--task", "inews", "--text-column", "body"])
    assert "--seeds: expected comma-separated integers, got '0,x'" in \
        _fails(capsys, stored_export, tmp_path, _own(train, train, "--seeds", "0,x"))
    assert "--select-metric: 'pearson' is not a classification metric" in \
        _fails(capsys, stored_export, tmp_path, _own(train, train, "--select-metric", "pearson"))
    existing = tmp_path / "model"
    existing.mkdir()
    capsys.readouterr()
    assert cli_main(["finetune", str(stored_export), *_own(train, train), "--save-model", str(existing)]) == 2
    assert "already exists" in capsys.readouterr().err and not any(existing.iterdir())
    existing.rmdir()


def test_bad_task_spec_files_name_the_file_and_field(capsys, stored_export, rows, tmp_path):
    write_rows(tmp_path / "train.csv", rows)
    spec = tmp_path / "task.yaml"
    for text, message in (("train: train.csv\ndev: train.csv\nlabel_colum: x\n", "unknown field 'label_colum'"),
                          ("dev: train.csv\n", "field 'train' missing"),
                          ("train: train.csv\ndev: train.csv\ntask_type: ranking\n", "task_type: 'ranking'"),
                          ("train: train.csv\ndev: train.csv\nepochs: many\n", "epochs: expected an integer"),
                          ("train: [train.csv\n", "line 2: not valid YAML")):
        spec.write_text(text, encoding="utf-8")
        err = _fails(capsys, stored_export, tmp_path, ["--task-spec", str(spec)])
        assert f"{spec}: " in err and message in err, (text, err)

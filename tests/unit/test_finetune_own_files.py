"""`roformer finetune` on a user's own labelled files (the stored run's export: no DeepSpeed job):
every format, single-text / text-pair classification and regression, string and integer labels,
seeds, the report, predictions, and the saved model in plain transformers with the project's code
blocked from import. Real text: tests/support/labelled_data.py."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.cli import main as cli_main
from tests.support.labelled_data import movie_review_rows, wordnet_pairs, write_rows

HF_PIPELINE = Path(__file__).resolve().parents[1] / "support" / "hf_pipeline_isolated.py"
QUICK = ["--epochs", "1", "--max-length", "32", "--batch-size", "16"]


@pytest.fixture(scope="module")
def reviews(tasks_dir, tmp_path_factory):
    """Movie-review sentences with word labels as CSV: train 64, dev 24, test 24."""
    root = tmp_path_factory.mktemp("reviews")
    return {split: write_rows(root / f"{split}.csv", movie_review_rows(tasks_dir, split, n))
            for split, n in (("train", 64), ("dev", 24), ("test", 24))}


@pytest.fixture(scope="module")
def ratings(tmp_path_factory):
    """Movie-review sentences with their mean human rating (-4..+4) as JSONL: a real regression task."""
    from launcher.downstream.task_data import rated_movie_reviews

    root = tmp_path_factory.mktemp("ratings")
    rows = [{"review": r["text"], "rating": r["rating"]} for r in rated_movie_reviews(root / "download")[::40]]
    return {"train": write_rows(root / "train.jsonl", rows[:120]), "dev": write_rows(root / "dev.jsonl", rows[120:150]),
            "test": write_rows(root / "test.jsonl", rows[150:180])}


def _run(capsys, argv) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli_main(argv)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def _hf_pipeline(model_dir: Path, inputs: list, tmp_path: Path) -> dict:
    """The saved model run by transformers' pipeline in a process where our packages cannot be imported."""
    inputs_json, out_json = tmp_path / "inputs.json", tmp_path / "hf_outputs.json"
    inputs_json.write_text(json.dumps(inputs), encoding="utf-8")
    proc = subprocess.run([sys.executable, "-I", str(HF_PIPELINE), str(model_dir), str(inputs_json), str(out_json)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out_json.read_text(encoding="utf-8"))


def _read_predictions(path: Path) -> list[dict]:
    with path.open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t" if path.suffix == ".tsv" else ","))


def test_string_labels_seeds_report_predictions_and_the_saved_model_in_plain_transformers(
        capsys, stored_export, reviews, tmp_path):
    out, model_dir, predictions = tmp_path / "report.json", tmp_path / "model", tmp_path / "predictions.csv"
    rc, stdout, stderr = _run(capsys, ["finetune", str(stored_export), "--train", str(reviews["train"]),
                                       "--dev", str(reviews["dev"]), "--test", str(reviews["test"]), *QUICK,
                                       "--seeds", "0,1", "--out", str(out), "--save-model", str(model_dir),
                                       "--predictions", str(predictions)])
    assert rc == 0, stderr
    report = json.loads(out.read_text())
    # The console: a table on stdout, no JSON; where each output went on stderr.
    assert "{" not in stdout and "accuracy" in stdout and "majority class baseline" in stdout
    assert f"JSON report -> {out}" in stderr and "seed 1" in stderr  # a progress bar per seed
    assert report["task_type"] == "classification" and report["label_names"] == ["negative", "positive"]
    assert report["label2id"] == {"negative": 0, "positive": 1} and report["held_out"] == "test"
    assert report["seeds"] == [0, 1] and [r["seed"] for r in report["runs"]] == [0, 1]
    for split in ("dev", "test"):
        for metric in ("accuracy", "macro_f1", "mcc"):
            spread = report["aggregate"][split][metric]
            values = [r[split][metric] for r in report["runs"]]
            assert spread["n"] == 2 and spread["min"] == min(values) and spread["max"] == max(values)
            assert spread["mean"] == pytest.approx(sum(values) / 2, abs=1e-5) == report[split][metric]
    assert report["test"]["examples"] == 24 and report["train_examples"] == 64
    assert report["majority_baseline"]["test"]["accuracy"] == report["baseline"]["test"]["accuracy"]

    rows = _read_predictions(predictions)
    test_rows = list(csv.DictReader(reviews["test"].open(encoding="utf-8")))
    assert [int(r["row"]) for r in rows] == list(range(1, 25))
    assert [r["label"] for r in rows] == [r["label"] for r in test_rows]
    assert {r["prediction"] for r in rows} <= {"negative", "positive"}
    chosen = next(r for r in report["runs"] if r["seed"] == report["chosen_seed"])
    assert sum(r["prediction"] == r["label"] for r in rows) / 24 == pytest.approx(chosen["test"]["accuracy"], abs=1e-5)

    hf = _hf_pipeline(model_dir, [r["text"] for r in test_rows], tmp_path)
    assert hf["config"]["id2label"] == {"0": "negative", "1": "positive"}
    assert hf["config"]["label2id"] == {"negative": 0, "positive": 1}
    assert hf["config"]["model_class"] == "RoFormerForSequenceClassification"
    assert [o["label"] for o in hf["outputs"]] == [r["prediction"] for r in rows]  # the same model, the same answers


def test_text_pairs_from_tsv_keep_both_texts_and_load_in_a_pipeline(capsys, stored_export, tmp_path):
    pairs = wordnet_pairs(96)
    files = {"train": write_rows(tmp_path / "train.tsv", pairs[:64]), "dev": write_rows(tmp_path / "dev.tsv", pairs[64:80]),
             "test": write_rows(tmp_path / "test.tsv", pairs[80:])}
    out, model_dir, predictions = tmp_path / "pairs.json", tmp_path / "model", tmp_path / "pred.tsv"
    rc, _, stderr = _run(capsys, ["finetune", str(stored_export), "--train", str(files["train"]), "--dev",
                                  str(files["dev"]), "--test", str(files["test"]), "--text-column", "sentence",
                                  "--text-pair-column", "gloss", *QUICK, "--max-length", "16", "--out", str(out),
                                  "--save-model", str(model_dir), "--predictions", str(predictions)])
    assert rc == 0, stderr
    report = json.loads(out.read_text())
    assert report["columns"] == {"text": "sentence", "text_pair": "gloss", "label": "label"}
    assert report["label_names"] == ["different", "same"] and report["truncated_share"]["train"] > 0.3

    # Truncation keeps a share of both texts: each cut input still has [CLS] a [SEP] b [SEP] with a and b non-empty.
    from launcher.export.export_reader import load_auto_tokenizer
    from launcher.downstream.fine_tuning import _encode
    from launcher.downstream.labelled_files import load_task
    from launcher.downstream.task_spec import TaskSpec

    data = load_task(TaskSpec(name="pairs", **files, text_column="sentence", text_pair_column="gloss"))
    tokenizer = load_auto_tokenizer(stored_export)
    for ids in _encode(tokenizer, data.train, 16)["input_ids"]:
        seps = [i for i, t in enumerate(ids) if t == tokenizer.sep_token_id]
        assert len(ids) <= 16 and ids[0] == tokenizer.cls_token_id and len(seps) == 2
        assert seps[0] > 1 and seps[1] > seps[0] + 1, ids

    rows = _read_predictions(predictions)
    hf = _hf_pipeline(model_dir, [{"text": p["sentence"], "text_pair": p["gloss"]} for p in pairs[80:]], tmp_path)
    assert [o["label"] for o in hf["outputs"]] == [r["prediction"] for r in rows]


def test_regression_is_inferred_from_float_labels_and_saved_as_regression(capsys, stored_export, ratings, tmp_path):
    out, model_dir, predictions = tmp_path / "ratings.json", tmp_path / "model", tmp_path / "pred.jsonl"
    rc, stdout, stderr = _run(capsys, ["finetune", str(stored_export), "--train", str(ratings["train"]),
                                       "--dev", str(ratings["dev"]), "--test", str(ratings["test"]),
                                       "--text-column", "review", "--label-column", "rating", *QUICK, "--epochs", "2",
                                       "--out", str(out), "--save-model", str(model_dir), "--predictions", str(predictions)])
    assert rc == 0, stderr
    report = json.loads(out.read_text())
    assert report["task_type"] == "regression" and report["select_metric"] == "pearson"
    assert report["label_names"] is None and "majority_baseline" not in report and "train mean baseline" in stdout
    assert set(report["test"]) == {"pearson", "spearman", "mse", "mae", "examples"}
    labels = [json.loads(line)["rating"] for line in ratings["train"].read_text().splitlines()]
    assert report["baseline"]["prediction"] == pytest.approx(sum(labels) / len(labels), abs=1e-5)
    assert report["baseline"]["test"]["pearson"] is None  # a constant prediction has no correlation
    assert report["baseline"]["test"]["mse"] > 0

    rows = [json.loads(line) for line in predictions.read_text().splitlines()]
    assert len(rows) == 30 and all(isinstance(r["prediction"], float) for r in rows)
    from sklearn.metrics import mean_squared_error

    mse = mean_squared_error([r["label"] for r in rows], [r["prediction"] for r in rows])
    assert mse == pytest.approx(report["test"]["mse"], rel=1e-3)

    texts = [json.loads(line)["review"] for line in ratings["test"].read_text().splitlines()]
    hf = _hf_pipeline(model_dir, texts, tmp_path)
    assert hf["config"]["problem_type"] == "regression" and hf["config"]["num_labels"] == 1
    assert hf["config"]["id2label"] == {"0": "rating"}
    assert [o["score"] for o in hf["outputs"]] == pytest.approx([r["prediction"] for r in rows], abs=1e-4)


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl", ".json", ".parquet"])
def test_every_format_reads_the_same_examples(tasks_dir, tmp_path, suffix):
    from launcher.downstream.labelled_files import load_task
    from launcher.downstream.task_spec import TaskSpec

    rows = movie_review_rows(tasks_dir, "train", 40)
    path = write_rows(tmp_path / f"train{suffix}", rows)
    data = load_task(TaskSpec(name="t", train=path, dev=path))
    assert data.train.texts == [r["text"] for r in rows]
    assert [data.label_names[i] for i in data.train.labels] == [r["label"] for r in rows]
    assert data.train.rows == list(range(1, 41)) and data.task_type == "classification"


def test_integer_labels_from_parquet_with_a_dev_fraction_and_no_test(capsys, stored_export, tasks_dir, tmp_path):
    rows = [{"text": r["text"], "label": 3 if r["label"] == "positive" else 10}  # 10 after 3: sorted as numbers
            for r in movie_review_rows(tasks_dir, "train", 80)]
    train = write_rows(tmp_path / "train.parquet", rows)
    out = tmp_path / "report.json"
    rc, stdout, stderr = _run(capsys, ["finetune", str(stored_export), "--train", str(train), "--dev-fraction", "0.25",
                                       *QUICK, "--select-metric", "accuracy", "--out", str(out)])
    assert rc == 0, stderr
    report = json.loads(out.read_text())
    assert report["label_names"] == ["3", "10"] and report["held_out"] == "dev" and report["test"] is None
    assert report["train_examples"] == 60 and report["dev"]["examples"] == 20 and report["select_metric"] == "accuracy"
    assert "dev split" in stdout

    from launcher.downstream.labelled_files import load_task
    from launcher.downstream.task_spec import TaskSpec

    data = load_task(TaskSpec(name="t", train=train, dev_fraction=0.25))
    assert sorted(data.train.rows + data.dev.rows) == list(range(1, 81))  # rows point into the one file
    assert data.dev.texts == [rows[r - 1]["text"] for r in data.dev.rows]


def test_compare_random_init_on_own_files(capsys, stored_export, reviews, tmp_path):
    out = tmp_path / "report.json"
    rc, stdout, stderr = _run(capsys, ["finetune", str(stored_export), "--train", str(reviews["train"]), "--dev",
                                       str(reviews["dev"]), *QUICK, "--seeds", "3", "--compare-random-init",
                                       "--out", str(out)])
    assert rc == 0, stderr
    report = json.loads(out.read_text())
    twin = report["random_init"]
    assert twin["config"]["init"] == "random" and twin["seeds"] == [3] and twin["files"] == report["files"]
    assert "random-init twin" in stdout and "pretraining changed dev macro_f1" in stdout


def test_a_task_spec_file_sets_files_columns_and_settings(capsys, stored_export, tasks_dir, tmp_path):
    data_dir = tmp_path / "data"
    for split, n in (("train", 48), ("dev", 16)):
        write_rows(data_dir / f"{split}.jsonl", [{"body": r["text"], "polarity": r["label"]}
                                                 for r in movie_review_rows(tasks_dir, split, n)])
    spec = tmp_path / "reviews.yaml"
    spec.write_text("name: my-reviews\ntrain: data/train.jsonl\ndev: data/dev.jsonl\ntext_column: body\n"
                    "label_column: polarity\nmax_length: 24\nepochs: 2\nlr: 2e-3\n", encoding="utf-8")
    out = tmp_path / "report.json"
    rc, _, stderr = _run(capsys, ["finetune", str(stored_export), "--task-spec", str(spec), "--out", str(out)])
    assert rc == 0, stderr
    report = json.loads(out.read_text())
    assert report["task"] == "my-reviews" and report["config"]["max_length"] == 24 and report["config"]["lr"] == 2e-3
    assert len(report["runs"][0]["epochs"]) == 2
    rc, _, stderr = _run(capsys, ["finetune", str(stored_export), "--task-spec", str(spec), "--epochs", "1",
                                  "--out", str(out)])  # the command line wins over the spec
    assert rc == 0 and len(json.loads(out.read_text())["runs"][0]["epochs"]) == 1


def test_bundled_tasks_are_ordinary_task_specs(tasks_dir):
    from launcher.downstream.labelled_files import load_task
    from launcher.downstream.tasks import bundled_spec

    spec = bundled_spec("inews", tasks_dir)
    assert spec.files == {s: tasks_dir / "inews" / f"{s}.jsonl" for s in ("train", "dev", "test")}
    data = load_task(spec)
    assert data.label_names == ["positive", "neutral", "negative"] and data.task_type == "classification"
    assert {len(data.train), len(data.dev), len(data.test)} and set(data.dev.labels) == {0, 1, 2}

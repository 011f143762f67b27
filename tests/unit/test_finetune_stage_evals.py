"""A user's task spec file as a stage-end eval (`logging.stage_end_evals`): checked with its files
before pretraining starts (the eval job's --check mode, as the run config check calls it), and run
on a checkpoint of the stored run (export + quick fine-tune in this process; no DeepSpeed job)."""
from __future__ import annotations

import json

import pytest

from launcher.stage_evals.specs import check_eval_specs
from launcher.stage_evals.job import run_stage_evals, validate_eval_names
from launcher.common.errors import UserError
from tests.support.labelled_data import movie_review_rows, write_rows


@pytest.fixture
def spec_file(tasks_dir, tmp_path):
    for split, n in (("train", 48), ("dev", 16), ("test", 16)):
        write_rows(tmp_path / "data" / f"{split}.csv", movie_review_rows(tasks_dir, split, n))
    spec = tmp_path / "reviews.yaml"
    spec.write_text("name: own-reviews\ntrain: data/train.csv\ndev: data/dev.csv\ntest: data/test.csv\n"
                    "max_length: 32\n", encoding="utf-8")
    return spec


def test_a_retrieval_task_spec_is_checked_with_its_files(tmp_path):
    from tests.support.labelled_data import wordnet_retrieval_rows

    for split, n in (("train", 12), ("dev", 6)):
        write_rows(tmp_path / "data" / f"{split}.jsonl", wordnet_retrieval_rows(split, n, words=0))
    spec = tmp_path / "senses.yaml"
    spec.write_text("name: own-senses\ntask_type: retrieval\ntrain: data/train.jsonl\ndev: data/dev.jsonl\n"
                    "text_column: question\ntext_pair_column: answer\nnegative_column: wrong\n", encoding="utf-8")
    validate_eval_names([f"{spec}:epochs=1", "wordnet-senses:max_train_examples=64"])
    write_rows(tmp_path / "data" / "dev.jsonl", [{"question": "q", "answer": "a"}, {"question": "q", "answer": "a"}])
    with pytest.raises(UserError) as err:
        check_eval_specs([str(spec)])
    assert str(err.value).startswith(f"logging.stage_end_evals: '{spec}': {tmp_path / 'data' / 'dev.jsonl'}: row 2")


def test_a_task_spec_entry_is_checked_with_its_files_before_training(spec_file):
    validate_eval_names(["mlm", str(spec_file), f"{spec_file}:epochs=1:lr=0.002"])
    check_eval_specs([f"{spec_file}:epochs=1"])  # the run config's check: a separate process, exit 0
    dev = spec_file.parent / "data" / "dev.csv"
    dev.write_text(dev.read_text(encoding="utf-8").replace(",positive\n", ",glowing\n", 1), encoding="utf-8")
    with pytest.raises(UserError) as err:
        check_eval_specs([str(spec_file)])
    assert str(err.value).startswith(f"logging.stage_end_evals: '{spec_file}': {dev}: row ")
    assert "column 'label': label 'glowing' never seen in train" in str(err.value)
    with pytest.raises(UserError, match="unknown eval 'reviews.txt'"):
        validate_eval_names(["reviews.txt"])
    with pytest.raises(UserError, match="task spec not found"):
        validate_eval_names([str(spec_file.parent / "gone.yaml")])


def test_a_task_spec_runs_at_a_stage_end(spec_file, stored_run, copy_of):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = copy_of(stored_run)
    written = run_stage_evals(run_dir, "global_step5", "short", [f"{spec_file}:epochs=1:max_train_examples=32"])
    path = run_dir / "evals" / "global_step5.own-reviews.json"
    assert written == {"own-reviews": path}
    report = json.loads(path.read_text())
    assert "error" not in report, report
    assert report["task"] == "own-reviews" and report["config"]["max_length"] == 32  # the spec's setting
    assert report["train_examples"] == 32 and report["test"]["examples"] == 16 and report["step"] == 5
    events = EventAccumulator(str(run_dir / "tb" / "evals"))
    events.Reload()
    assert {"eval/own-reviews/test_accuracy", "eval/own-reviews/dev_mcc",
            "eval/own-reviews/test_baseline_accuracy"} <= set(events.Tags()["scalars"])

"""Fine-tuning end to end from a real export on the real labelled tasks (the session's trainer
export), and its bad input (on the stored run's export: no DeepSpeed job)."""
from __future__ import annotations

import json

from launcher.cli import main as cli_main


def test_movie_reviews_beats_the_majority_baseline(trainer_export, tasks_dir, tmp_path):
    """The tiny model (pretrained 16 steps) must learn sentiment from 2000 real sentences: a real
    signal, as the dev/test sets are balanced (a constant answer scores ~0.5 accuracy, ~0.33 F1)."""
    out = tmp_path / "movie.json"
    rc = cli_main(["finetune", str(trainer_export), "--task", "movie-reviews", "--task-data", str(tasks_dir),
                   "--max-train-examples", "2000", "--epochs", "4", "--lr", "1e-3", "--max-length", "64",
                   "--max-eval-examples", "500", "--threads", "1", "--out", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    base = report["majority_baseline"]
    assert report["train_examples"] == 2000 and len(report["runs"][0]["epochs"]) == 4
    assert report["test"]["examples"] == 500 and report["dev"]["examples"] == 500
    assert min(report["train_label_counts"]) > 800  # the seeded subset keeps both classes
    assert report["test"]["accuracy"] >= base["test"]["accuracy"] + 0.06, report
    assert report["test"]["macro_f1"] >= base["test"]["macro_f1"] + 0.15, report
    assert report["dev"]["macro_f1"] == max(e["dev"]["macro_f1"] for e in report["runs"][0]["epochs"])  # best epoch kept


def test_inews_long_documents_are_truncated_and_run(trainer_export, tasks_dir, tmp_path):
    """The Chinese 3-class task runs end to end; at 64 tokens nearly every ~1.2k-char document is cut."""
    out, predicted = tmp_path / "inews.json", tmp_path / "inews_test.jsonl"
    rc = cli_main(["finetune", str(trainer_export), "--task", "inews", "--task-data", str(tasks_dir),
                   "--max-train-examples", "48", "--epochs", "1", "--max-length", "64", "--max-eval-examples", "24",
                   "--out", str(out), "--predictions", str(predicted)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["label_names"] == ["positive", "neutral", "negative"]
    assert len(report["train_label_counts"]) == 3 and sum(report["train_label_counts"]) == 48
    assert report["truncated_share"]["train"] > 0.8 and report["truncated_share"]["test"] > 0.8
    assert set(report["unk_token_share"]) == {"train", "dev", "test"}
    assert all(0.0 <= v <= 1.0 for v in report["unk_token_share"].values())
    assert report["majority_baseline"]["label_name"] in report["label_names"]
    assert report["test"]["examples"] == 24
    # The test figures are those of the predictions written, F1 per class by hand (a class never predicted: 0).
    rows = [json.loads(line) for line in predicted.read_text().splitlines()]
    assert len(rows) == 24 and {r["label"] for r in rows} <= set(report["label_names"])
    f1 = []
    for name in report["label_names"]:
        hits = sum(r["prediction"] == r["label"] == name for r in rows)
        guessed, actual = sum(r["prediction"] == name for r in rows), sum(r["label"] == name for r in rows)
        f1.append(2 * hits / (guessed + actual) if guessed + actual else 0.0)
    assert abs(report["test"]["macro_f1"] - sum(f1) / len(f1)) < 1e-4, (report["test"], rows)
    assert abs(report["test"]["accuracy"] - sum(r["prediction"] == r["label"] for r in rows) / 24) < 1e-4

"""`roformer finetune --task-type retrieval` on a user's own files (the stored run's export: no DeepSpeed
job): three formats, string queries with several relevant passages, a separate corpus, hard negatives,
seeds, the report, the top-10 predictions, the saved model in plain sentence-transformers (project code
blocked from import) reproducing our test metrics, and zero-shot evaluation of the export as it is.
Real text: WordNet senses (tests/support/labelled_data.py)."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.cli import main as cli_main
from tests.support.labelled_data import wordnet_retrieval_rows, write_rows

ST_ISOLATED = Path(__file__).resolve().parents[1] / "support" / "st_isolated.py"
QUICK = ["--epochs", "1", "--max-length", "32", "--batch-size", "16"]
METRICS = ("ndcg@10", "mrr@10", "recall@1", "recall@10", "map@100")


@pytest.fixture(scope="module")
def senses(tmp_path_factory):
    """train.csv, dev.jsonl, test.parquet (question / answer / wrong) and a corpus.tsv (column gloss) of
    other WordNet glosses."""
    root = tmp_path_factory.mktemp("senses")
    files = {"train": write_rows(root / "train.csv", wordnet_retrieval_rows("train", 48)),
             "dev": write_rows(root / "dev.jsonl", wordnet_retrieval_rows("dev", 24)),
             "test": write_rows(root / "test.parquet", wordnet_retrieval_rows("test", 24))}
    others = [r["answer"] for r in wordnet_retrieval_rows("train", 120)[60:110]]
    files["corpus"] = write_rows(root / "corpus.tsv", [{"gloss": g} for g in others])
    return files


def _run(capsys, argv) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli_main(argv)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def _own(files, *extra) -> list[str]:
    return ["--task-type", "retrieval", "--train", str(files["train"]), "--dev", str(files["dev"]),
            "--test", str(files["test"]), "--text-column", "question", "--text-pair-column", "answer", *extra]


def _ir_inputs(files, column="answer"):
    """The test split as the evaluator takes it, built here from the files (not by our code)."""
    import pandas as pd

    test = pd.read_parquet(files["test"])
    corpus = list(pd.read_csv(files["corpus"], sep="\t")["gloss"])
    pool = list(dict.fromkeys([*test[column], *test["wrong"], *corpus]))
    queries = list(dict.fromkeys(test["question"]))
    relevant: dict[str, list] = {}
    for q, p in zip(test["question"], test[column]):
        relevant.setdefault(f"q{queries.index(q)}", []).append(f"d{pool.index(p)}")
    return ({f"q{i}": q for i, q in enumerate(queries)}, {f"d{i}": p for i, p in enumerate(pool)}, relevant)


def test_own_files_in_three_formats_with_a_corpus_seeds_predictions_and_the_saved_model(capsys, stored_export, senses,
                                                                                       tmp_path):
    out, model_dir, predictions = tmp_path / "report.json", tmp_path / "model", tmp_path / "top10.csv"
    rc, stdout, stderr = _run(capsys, ["finetune", str(stored_export), *_own(
        senses, "--negative-column", "wrong", "--corpus", str(senses["corpus"]), "--corpus-text-column", "gloss"),
        *QUICK, "--seeds", "0,1", "--out", str(out), "--save-model", str(model_dir), "--predictions", str(predictions)])
    assert rc == 0, stderr
    report = json.loads(out.read_text())
    assert "{" not in stdout and "ndcg@10" in stdout and "zero-shot baseline" in stdout
    assert report["task_type"] == "retrieval" and report["select_metric"] == "ndcg@10" and report["held_out"] == "test"
    assert report["columns"] == {"query": "question", "passage": "answer", "negative": "wrong", "corpus_text": "gloss"}
    queries, pool, relevant = _ir_inputs(senses)
    assert max(len(v) for v in relevant.values()) >= 2  # "what does WORD mean?": several relevant passages
    assert report["sizes"]["test"] == {"rows": sum(map(len, relevant.values())), "queries": len(queries),
                                       "passages": len(pool)}  # ranked against the split's passages + the corpus
    assert report["sizes"]["corpus"] == 50 and report["train_examples"] == report["sizes"]["train"]["rows"]
    for split in ("dev", "test"):
        for metric in METRICS:
            values = [run[split][metric] for run in report["runs"]]
            assert report["aggregate"][split][metric] == {"mean": pytest.approx(sum(values) / 2, abs=1e-5),
                                                          "min": min(values), "max": max(values), "n": 2}
            assert 0.0 <= report[split][metric] <= 1.0
        assert report[split]["recall@10"] >= report[split]["recall@1"]
    for run in report["runs"]:
        assert [e["epoch"] for e in run["epochs"]] == [0, 1] and run["best_epoch"] == 1 and run["steps"] >= 4
        assert run["epochs"][1]["train_loss"] > 0 and run["zero_shot"]["test"]["queries"] == len(queries)
    assert report["runs"][0]["dev"] != report["runs"][1]["dev"]  # the seeds differ (batch order)

    with predictions.open(encoding="utf-8", newline="") as f:
        lines = list(csv.DictReader(f))
    assert len(lines) == 10 * len(queries) and [int(r["rank"]) for r in lines[:10]] == list(range(1, 11))
    assert {r["query"] for r in lines} == set(queries.values())
    relevant_texts = {queries[q]: {pool[c] for c in cids} for q, cids in relevant.items()}
    assert all((line["relevant"] == "True") == (line["passage"] in relevant_texts[line["query"]]) for line in lines)
    assert any(line["relevant"] == "True" for line in lines)
    scores = [float(r["score"]) for r in lines[:10]]
    assert scores == sorted(scores, reverse=True)

    # The saved model in plain sentence-transformers reproduces the chosen seed's test metrics.
    inputs = tmp_path / "ir.json"
    inputs.write_text(json.dumps({"queries": queries, "corpus": pool, "relevant": relevant, "batch_size": 64}))
    proc = subprocess.run([sys.executable, "-I", str(ST_ISOLATED), str(model_dir), str(inputs), str(tmp_path / "st.json")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = json.loads((tmp_path / "st.json").read_text())
    assert theirs["max_seq_length"] == 32 and theirs["modules"] == ["Transformer", "Pooling"]
    assert theirs["pooling"]["pooling_mode"] == "mean"
    chosen = next(run for run in report["runs"] if run["seed"] == report["chosen_seed"])
    for metric in METRICS:
        assert theirs["metrics"][f"cosine_{metric}"] == pytest.approx(chosen["test"][metric], abs=1e-4), metric


def test_zero_shot_evaluates_the_export_as_it_is(capsys, stored_export, senses, tmp_path):
    """--epochs 0 through a task spec: no training; the scores are those of SentenceTransformer(export)
    (mean pooling) at --max-length, and the random-init twin scores differently."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator

    spec = tmp_path / "senses.yaml"
    spec.write_text(f"name: senses\ntask_type: retrieval\ntrain: {senses['train']}\ndev: {senses['dev']}\n"
                    f"test: {senses['test']}\ntext_column: question\ntext_pair_column: answer\n"
                    f"negative_column: wrong\ncorpus: {senses['corpus']}\ncorpus_text_column: gloss\nmax_length: 32\n")
    out = tmp_path / "zero.json"
    rc, _, stderr = _run(capsys, ["finetune", str(stored_export), "--task-spec", str(spec), "--epochs", "0",
                                  "--compare-random-init", "--out", str(out)])
    assert rc == 0, stderr
    report = json.loads(out.read_text())
    run = report["runs"][0]
    assert report["task"] == "senses" and report["train_examples"] == 0 and run["best_epoch"] == 0
    assert run["steps"] == 0 and run["train_examples_per_second"] is None
    assert report["test"] == report["baseline"]["test"]  # zero-shot: the baseline itself

    model = SentenceTransformer(str(stored_export), device="cpu")
    model.max_seq_length = 32
    queries, pool, relevant = _ir_inputs(senses)
    direct = InformationRetrievalEvaluator(queries, pool, {q: set(c) for q, c in relevant.items()}, mrr_at_k=[10],
                                           ndcg_at_k=[10], accuracy_at_k=[1, 10], precision_recall_at_k=[1, 10],
                                           map_at_k=[100], batch_size=64, write_csv=False)(model)
    for metric in METRICS:
        assert report["test"][metric] == pytest.approx(direct[f"cosine_{metric}"], abs=1e-4), metric
    assert report["random_init"]["test"] != report["test"]


def test_a_bundled_retrieval_task_is_an_ordinary_task_spec(tasks_dir):
    from launcher.downstream.retrieval_data import load_retrieval_task
    from launcher.downstream.tasks import bundled_spec

    spec = bundled_spec("wordnet-senses", tasks_dir)
    assert (spec.task_type, spec.text_column, spec.text_pair_column, spec.negative_column) == \
        ("retrieval", "query", "passage", "negative")
    assert spec.settings == {"max_length": 64}  # the task's own setting; the command line's flag wins
    data = load_retrieval_task(spec)
    words = {split: {json.loads(line)["word"] for line in (tasks_dir / "wordnet-senses" / f"{split}.jsonl").open()}
             for split in ("train", "dev", "test")}
    assert not words["train"] & words["dev"] and not words["train"] & words["test"] and not words["dev"] & words["test"]
    assert len(data.train) > 10000 and len(data.dev) > 1000 and len(data.test) > 1000
    assert all(n != p for p, n in zip(data.test.passages, data.test.negatives))


def test_a_dev_fraction_holds_out_whole_queries(tmp_path):
    """--dev-fraction for retrieval holds out a share of the distinct queries, each with all its rows, so a
    query with several relevant passages is never split between train and dev."""
    from launcher.downstream.retrieval_data import load_retrieval_task
    from launcher.downstream.task_spec import TaskSpec

    train = write_rows(tmp_path / "train.jsonl", wordnet_retrieval_rows("train", 40))
    spec = TaskSpec(name="senses", train=train, dev_fraction=0.25, text_column="question", text_pair_column="answer",
                    task_type="retrieval")
    data = load_retrieval_task(spec)
    assert not set(data.train.queries) & set(data.dev.queries)
    assert len(set(data.dev.queries)) == round(0.25 * len(set(data.train.queries) | set(data.dev.queries)))
    assert len(data.train) + len(data.dev) == 40 + sum(r["question"].startswith("what does") for r in
                                                        wordnet_retrieval_rows("train", 40))
    assert data.train.negatives is None and data.dev.name == "dev" and data.test is None

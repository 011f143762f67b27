"""`roformer eval-mlm EXPORT --input FILE... [--text-column C]` (issue 23 part 3): the user's own text,
read by data_pipeline's readers and tokenized with the export's tokenizer, scored per length exactly
as a prepared split is. On the stored run's export (no DeepSpeed job)."""
from __future__ import annotations

import json
import math

import pytest

from launcher.cli import main as cli_main
from tests.support.corpus_files import english_paragraphs, write_jsonl

SEQ_LENS = "32,128"


@pytest.fixture(scope="module")
def own_text(tmp_path_factory):
    """The same 60 paragraphs as .txt (one per line), .jsonl (field `body`) and .parquet (column `body`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("own_text")
    texts = [" ".join(p.split()) for p in english_paragraphs(4)[:60]]
    (root / "notes.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    write_jsonl(root / "notes.jsonl", texts, field="body")
    pq.write_table(pa.table({"body": texts, "id": list(range(len(texts)))}), root / "notes.parquet")
    return root, texts


def _eval(capsys, argv, tmp_path) -> dict:
    out = tmp_path / "report.json"
    capsys.readouterr()
    assert cli_main(["eval-mlm", *argv, "--seq-lens", SEQ_LENS, "--tokens", "0", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_every_format_gives_the_same_figures(capsys, stored_export, own_text, tmp_path):
    root, texts = own_text
    reports = {
        "txt": _eval(capsys, [str(stored_export), "--input", str(root / "notes.txt")], tmp_path),
        "jsonl": _eval(capsys, [str(stored_export), "--input", str(root / "notes.jsonl"), "--text-column", "body"],
                       tmp_path),
        "parquet": _eval(capsys, [str(stored_export), "--input", str(root / "notes.parquet"), "--text-column",
                                  "body"], tmp_path),
    }
    figures = {fmt: [(r["seq_len"], r["tokens"], r["masked_tokens"], r["loss"], r["accuracy"])
                     for r in report["results"]] for fmt, report in reports.items()}
    assert figures["txt"] == figures["jsonl"] == figures["parquet"]
    report = reports["jsonl"]
    assert report["split"] == "input" and report["data"] == [str((root / "notes.jsonl").resolve())]
    assert [r["seq_len"] for r in report["results"]] == [32, 128]
    for row in report["results"]:
        assert 0 < row["loss"] < 20 and 0 <= row["accuracy"] <= 1
        assert math.isclose(row["perplexity"], math.exp(row["loss"]), rel_tol=1e-3)
        # All of the text (--tokens 0): every document's tokens and its closing [SEP], once.
        assert row["tokens"] - row["sequences"] >= sum(len(t.split()) for t in texts)


def test_same_figures_as_the_prepared_split_of_the_same_text(capsys, stored_export, own_text, tmp_path):
    """--input is `data prepare --tokenizer EXPORT` + eval of that split: the same numbers either way."""
    root, _ = own_text
    capsys.readouterr()
    assert cli_main(["data", "prepare", "--input", str(root / "notes.txt"), "--out", str(tmp_path / "data"),
                     "--tokenizer", str(stored_export), "--valid-fraction", "0", "--no-dedup"]) == 0
    prepared = _eval(capsys, [str(stored_export), "--data", str(tmp_path / "data"), "--split", "train"], tmp_path)
    direct = _eval(capsys, [str(stored_export), "--input", str(root / "notes.txt")], tmp_path)
    assert [r["loss"] for r in prepared["results"]] == [r["loss"] for r in direct["results"]]


def _fails(capsys, argv) -> str:
    capsys.readouterr()
    rc = cli_main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) >= 1, err
    return err[-1]


def test_bad_input_is_one_line(capsys, stored_export, own_text, tmp_path):
    root, _ = own_text
    export = str(stored_export)
    err = _fails(capsys, ["eval-mlm", export, "--input", str(root / "notes.jsonl"), "--text-column", "text"])
    assert str(root / "notes.jsonl") in err and "text" in err
    err = _fails(capsys, ["eval-mlm", export, "--input", str(root / "notes.parquet"), "--text-column", "missing"])
    assert "missing" in err and "body" in err
    assert "applies to --input files only" in _fails(capsys, ["eval-mlm", export, "--data", str(tmp_path),
                                                              "--text-column", "body"])
    assert "not allowed with argument" in _fails(  # argparse: one source of text or the other
        capsys, ["eval-mlm", export, "--data", str(tmp_path), "--input", str(root / "notes.txt")])
    assert not (tmp_path / "report.json").exists()

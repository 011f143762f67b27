"""eval-mlm on a real export: lengths beyond the trained one, figures checked against transformers'
own RoFormer on the same masked batches, determinism (on the session's trainer export), and bad
input (corrupt weights, no tokenizer; on copies of the stored run's export, no DeepSpeed job)."""
from __future__ import annotations

import json

import pytest

from launcher.cli import main as cli_main
from tests.support.helpers import TINY_MAX_SEQ_LEN as TRAIN_SEQ_LEN

LONG = 4 * TRAIN_SEQ_LEN  # 256: four times the longest pretraining length


@pytest.fixture(scope="module")
def stored_data(stored_run):
    return stored_run.parent / "data"


@pytest.fixture
def export_copy(stored_export, copy_of):
    return copy_of(stored_export)


def _fails(capsys, argv) -> str:
    capsys.readouterr()
    rc = cli_main(argv)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2 and err.startswith(f"roformer {argv[0]}: error: "), err
    return err


def test_corrupt_safetensors_is_named(capsys, export_copy, stored_data, tmp_path):
    weights = export_copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in a tensor: structurally still valid
    weights.write_bytes(bytes(data))
    out = tmp_path / "result.json"
    out.write_text("previous result")
    from launcher.outputs.gate import EVAL_REPORT
    from launcher.outputs.written import record_written

    record_written(out, EVAL_REPORT.name, EVAL_REPORT.made_by)  # an earlier eval-mlm's: the gate lets it be replaced
    argv = ["eval-mlm", str(export_copy), "--data", str(stored_data), "--seq-lens", "64",
            "--out", str(out)]
    assert "model.safetensors: corrupt (sha256 differs" in _fails(capsys, argv)
    assert out.read_text() == "previous result"
    weights.write_bytes(bytes(data[: len(data) // 3]))  # truncated: caught even without checksums
    (export_copy / "export_info.json").unlink()
    assert "model.safetensors: corrupt safetensors file" in _fails(capsys, argv)


def test_missing_tokenizer_is_named(capsys, export_copy, stored_data):
    (export_copy / "tokenizer.json").unlink()
    err = _fails(capsys, ["eval-mlm", str(export_copy), "--data", str(stored_data)])
    assert "tokenizer missing (tokenizer.json or vocab.txt not found)" in err


def test_length_and_data_errors(capsys, stored_export, stored_data, tmp_path):
    export_dir = str(stored_export)
    assert "--seq-lens: 1 is too short" in _fails(capsys, ["eval-mlm", export_dir, "--data",
                                                          str(stored_data), "--seq-lens", "1"])
    assert "not found" in _fails(capsys, ["eval-mlm", export_dir, "--data", str(tmp_path / "nothing")])


def test_tokenizer_other_than_the_shards_is_refused(capsys, export_copy, stored_data):
    (export_copy / "export_info.json").unlink()  # a foreign directory: no recorded checksums
    with open(export_copy / "spm.model", "ab") as f:
        f.write(b"\0")  # another tokenizer file than the one the shards were built with
    err = _fails(capsys, ["eval-mlm", str(export_copy), "--data", str(stored_data)])
    assert "shards were built with tokenizer" in err


def test_document_attention_scores_the_same_masked_tokens_with_each_document_alone(capsys, stored_export, stored_data):
    reports = {}
    for attention in ("sequence", "document"):
        capsys.readouterr()
        assert cli_main(["eval-mlm", str(stored_export), "--data", str(stored_data), "--seq-lens", "64",
                         "--tokens", "4096", "--attention", attention]) == 0
        reports[attention] = json.loads(capsys.readouterr().out)
    sequence, document = (reports[a]["results"][0] for a in ("sequence", "document"))
    assert reports["document"]["config"]["attention"] == "document"
    assert document["masked_tokens"] == sequence["masked_tokens"] > 0  # the same tokens, masked the same way
    assert document["loss"] != sequence["loss"]  # seen without the other documents of their sequences

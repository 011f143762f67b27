"""eval-mlm on a real export: lengths beyond the trained one, figures checked against transformers'
own RoFormer on the same masked batches, determinism (on the session's trainer export), and bad
input (corrupt weights, no tokenizer; on copies of the stored run's export, no DeepSpeed job)."""
from __future__ import annotations

import json
import math

import pytest
import torch

from data_pipeline import MaskingConfig, PretrainBatches, open_corpus
from launcher.cli import main as cli_main
from tests.helpers import TINY_MAX_SEQ_LEN as TRAIN_SEQ_LEN

LONG = 4 * TRAIN_SEQ_LEN  # 256: four times the longest pretraining length


@pytest.fixture(scope="module")
def report(tmp_path_factory, trainer_export, tiny_data):
    out = tmp_path_factory.mktemp("eval_mlm") / "mlm.json"
    rc = cli_main(["eval-mlm", str(trainer_export), "--data", str(tiny_data),
                   "--seq-lens", f"{TRAIN_SEQ_LEN},{LONG}", "--tokens", "4096", "--out", str(out)])
    assert rc == 0
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def stored_data(stored_run):
    return stored_run.parent / "data"


@pytest.mark.multiprocess
def test_reports_every_length_and_marks_the_untrained_one(report):
    assert report["trained_max_seq_len"] == TRAIN_SEQ_LEN
    by_len = {r["seq_len"]: r for r in report["results"]}
    assert set(by_len) == {TRAIN_SEQ_LEN, LONG}
    assert by_len[TRAIN_SEQ_LEN]["longer_than_trained"] is False
    assert by_len[LONG]["longer_than_trained"] is True
    for row in by_len.values():
        assert row["masked_tokens"] > 100
        assert math.isclose(row["perplexity"], math.exp(row["loss"]), rel_tol=1e-3)
        assert 0.0 <= row["accuracy"] <= 1.0
    # Same text at every length: the budget, not the length, decides how much is scored.
    assert abs(by_len[LONG]["tokens"] - by_len[TRAIN_SEQ_LEN]["tokens"]) < 0.1 * by_len[LONG]["tokens"]


@pytest.mark.multiprocess
def test_loss_matches_transformers_on_the_same_masked_batches(report, trainer_export, tiny_data):
    """An independent computation: transformers' RoFormerForMaskedLM scores the same batches."""
    from transformers import RoFormerForMaskedLM

    hf = RoFormerForMaskedLM.from_pretrained(str(trainer_export)).eval()
    corpus = open_corpus(tiny_data, "valid")
    row = next(r for r in report["results"] if r["seq_len"] == LONG)
    batches = PretrainBatches(corpus, seed=report["config"]["seed"], masking=MaskingConfig(mask_prob=0.15))
    total, count, correct = 0.0, 0, 0
    sequences = math.ceil(report["config"]["tokens"] / (LONG - 1))
    micro = row["micro_batch_size"]
    with torch.no_grad():
        for i, batch in enumerate(batches.iter_eval_batches(LONG, micro, max_batches=math.ceil(sequences / micro))):
            batch = {k: v[: sequences - i * micro] for k, v in batch.items()}
            logits = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            picked = batch["labels"] != -100
            total += torch.nn.functional.cross_entropy(logits[picked], batch["labels"][picked], reduction="sum").item()
            correct += int((logits[picked].argmax(-1) == batch["labels"][picked]).sum())
            count += int(picked.sum())
    assert count == row["masked_tokens"]
    assert math.isclose(total / count, row["loss"], abs_tol=1e-3)
    assert math.isclose(correct / count, row["accuracy"], abs_tol=1e-4)


@pytest.mark.multiprocess
def test_same_inputs_same_figures(report, trainer_export, tiny_data):
    from launcher.downstream.eval_mlm import MLMEvalConfig, evaluate_mlm

    again = evaluate_mlm(MLMEvalConfig(export_dir=trainer_export, data_dir=tiny_data,
                                       seq_lens=[LONG], tokens=4096))
    first = next(r for r in report["results"] if r["seq_len"] == LONG)
    assert {k: v for k, v in again["results"][0].items() if k != "seconds"} == \
        {k: v for k, v in first.items() if k != "seconds"}


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
    assert "tokenizer missing (tokenizer.json not found)" in err


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

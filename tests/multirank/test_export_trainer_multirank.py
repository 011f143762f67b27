"""Export of a run made by the real trainer (the session's `trainer_run`: 3 stages, 2 ranks, ZeRO-2),
and the stage-end eval job started the way the trainer starts it."""
from __future__ import annotations

import json
import shutil
import time

import pytest
import torch

from launcher.run_dir.layout import RunDir
from launcher.stage_evals.start import start_stage_end_job
from roformer.hf_interop import load_pretrained
from tests.support.helpers import TINY_STAGES, hf_isolated_logits, newest_checkpoint


@pytest.fixture
def run_copy(trainer_run, copy_of):
    """A private copy: the stage-eval job writes exports/, evals/ and tb/evals into it."""
    return copy_of(trainer_run)


def test_trainer_checkpoint_exports_with_card_and_parity(trainer_run, trainer_export, tmp_path):
    point = newest_checkpoint(trainer_run)
    out = trainer_export
    card = (out / "README.md").read_text()
    for stage in TINY_STAGES:  # the whole schedule, each stage reached by the final checkpoint
        assert f"| {stage['name']} | {stage['max_seq_len']} | {stage['global_batch_size']} | {stage['steps']} |" in card
    assert card.count("| yes |") == len(TINY_STAGES)
    assert f"| tokens seen | {point.sidecar.consumed_tokens:,} |" in card
    assert f"| loss | {point.sidecar.last_validation['loss']:.4g} |" in card
    info = json.loads((out / "export_info.json").read_text())
    assert info["tag"] == point.tag and info["max_seq_len_trained"] == max(s["max_seq_len"] for s in TINY_STAGES)

    hf = hf_isolated_logits([out], ["Patches go to the mailing list.", "补丁"], tmp_path)[0]
    with torch.no_grad():
        ours = load_pretrained(out).eval()(hf["input_ids"], attention_mask=hf["attention_mask"]).logits
    real = hf["attention_mask"].bool()
    assert torch.allclose(ours[real], hf["logits"][real], atol=1e-4, rtol=1e-4)


def test_stage_end_evals_run_detached_and_report(run_copy, tasks_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    point = newest_checkpoint(run_copy)
    specs = ["mlm", "movie-reviews:max_train_examples=64:epochs=1:max_eval_examples=32:max_length=32",
             "wordnet-senses:max_train_examples=64:epochs=1:max_eval_examples=32:max_length=32"]
    started = time.perf_counter()
    proc = start_stage_end_job(RunDir(run_copy), point.tag, TINY_STAGES[-1]["name"], specs)
    assert time.perf_counter() - started < 5  # returns at once; the work happens in the child
    assert proc is not None and proc.poll() is None
    # Retention may delete the checkpoint while the job runs: it reads its hard-linked snapshot.
    shutil.rmtree(run_copy / "checkpoints" / point.tag)
    assert proc.wait(timeout=240) == 0, (run_copy / "evals" / f"{point.tag}.log").read_text()[-3000:]
    assert not [p for p in (run_copy / "evals").iterdir() if p.name.startswith(".snapshot")]

    mlm = json.loads((run_copy / "evals" / f"{point.tag}.mlm.json").read_text())
    assert "error" not in mlm and mlm["step"] == point.sidecar.step and mlm["stage"] == "wide"
    assert mlm["export"] == str((run_copy / "exports" / point.tag).resolve())
    assert [r["seq_len"] for r in mlm["results"]] == [64, 128]
    assert mlm["results"][1]["longer_than_trained"] is True
    movie = json.loads((run_copy / "evals" / f"{point.tag}.movie-reviews.json").read_text())
    assert "error" not in movie and movie["train_examples"] == 64 and movie["test"]["examples"] == 32
    assert (run_copy / "exports" / point.tag / "model.safetensors").is_file()
    senses = json.loads((run_copy / "evals" / f"{point.tag}.wordnet-senses.json").read_text())
    assert "error" not in senses and senses["task_type"] == "retrieval" and senses["train_examples"] == 64
    assert senses["test"]["queries"] == 32 and senses["baseline"]["kind"] == "zero-shot"

    events = EventAccumulator(str(run_copy / "tb" / "evals"))
    events.Reload()
    scalars = events.Tags()["scalars"]
    assert {"eval/mlm/loss_len64", "eval/mlm/perplexity_len128", "eval/movie-reviews/test_accuracy",
            "eval/wordnet-senses/test_ndcg@10", "eval/wordnet-senses/test_baseline_recall@10"} <= set(scalars)
    assert not [tag for tag in scalars if tag.endswith(("_queries", "_passages", "_examples"))]
    (event,) = events.Scalars("eval/mlm/loss_len128")
    assert event.step == point.sidecar.step and event.value == pytest.approx(mlm["results"][1]["loss"], rel=1e-5)

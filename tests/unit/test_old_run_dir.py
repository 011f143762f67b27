"""Run directories written by earlier code (tests/fixtures/README.md) read by today's: the sidecar, the export
and its weights; the stored data position (data state format 1) is refused before any compute, as the
data pipeline's format 2 (global mixing) cannot continue it.
"""
from __future__ import annotations

import json

import pytest
import torch

from launcher.run_dir.layout import sidecar_path
from launcher.checkpoint.catalogue import read_sidecar, write_sidecar
from roformer.hf_interop import load_pretrained
from tests.support.helpers import stored_run_resume_config

TAG = "global_step5"


def test_stored_sidecar_reads_into_the_dataclass_and_writes_back_the_same_file(stored_run, tmp_path):
    original = json.loads(sidecar_path(stored_run / "checkpoints" / TAG).read_text())
    sidecar = read_sidecar(stored_run / "checkpoints" / TAG)
    assert (sidecar.tag, sidecar.step, sidecar.stage_name, sidecar.world_size, sidecar.zero_stage) == \
        (TAG, 5, "long", 2, 2)
    assert sidecar.model_config["vocab_size"] == 500 and sidecar.data_state["version"] == 1
    write_sidecar(tmp_path, sidecar)
    assert json.loads(sidecar_path(tmp_path).read_text()) == original  # same keys, values and order
    assert list(json.loads(sidecar_path(tmp_path).read_text())) == list(original)


def test_stored_run_exports_with_card_and_the_consolidated_weights(stored_run, stored_export):
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    card = (stored_export / "README.md").read_text()
    for row in ("| optimizer steps | 5 |", "| stage at save | long |", "| tokens seen | 1,280 |",
                "| sequences seen | 32 |", "| world size at save | 2 |", "| ZeRO stage | 2 |",
                "| training precision | fp32 |", "| short | 32 | 8 | 3 | 0 | yes |", "| long | 64 | 4 | 2 | 3 | yes |"):
        assert row in card
    info = json.loads((stored_export / "export_info.json").read_text())
    assert (info["tag"], info["step"], info["max_seq_len_trained"]) == (TAG, 5, 64)
    expected = get_fp32_state_dict_from_zero_checkpoint(str(stored_run / "checkpoints"), tag=TAG)
    exported = load_pretrained(stored_export).state_dict()  # transformers' names mapped back to ours
    assert set(exported) == set(expected)
    assert all(torch.equal(exported[k], expected[k].float()) for k in expected)


def test_stored_data_position_is_refused_before_any_compute(stored_run, copy_of, monkeypatch, capsys):
    from launcher.train import rank_entry

    run_dir = copy_of(stored_run.parent) / "run"
    # heartbeats/: the hang watchdog's liveness files, rewritten by every launch (not run records)
    before = {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir() if p.name != "heartbeats"}
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert rank_entry.main(["--config", str(stored_run_resume_config(run_dir)), "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("pretrain (rank 0): error: ") and "data state format 1" in err
    assert {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir() if p.name != "heartbeats"} == before


@pytest.mark.parametrize("written_by", ["previous_run", "release_run"])
def test_earlier_release_checkpoint_verifies_and_exports(written_by, request, tmp_path):
    """The release before the checkpoint component, and the one the start-up work began from: their
    format-2 sidecar's file records still verify, and their checkpoint exports to the weights DeepSpeed
    consolidates from the same files."""
    run_dir = request.getfixturevalue(written_by)
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    from launcher.export.exporter import export_checkpoint
    from launcher.checkpoint.catalogue import CheckpointCatalogue

    point = CheckpointCatalogue.scan(run_dir).newest_intact()
    assert (point.tag, point.verified, point.sidecar.format, point.sidecar.world_size) == (TAG, True, 2, 2)
    assert point.sidecar.files and point.sidecar.tokenizer_sha256
    out = export_checkpoint(run_dir, tmp_path / "export")
    assert json.loads((out / "export_info.json").read_text())["step"] == 5
    expected = get_fp32_state_dict_from_zero_checkpoint(str(run_dir / "checkpoints"), tag=TAG)
    exported = load_pretrained(out).state_dict()
    assert set(exported) == set(expected)
    assert all(torch.equal(exported[k], expected[k].float()) for k in expected)

"""A run directory written before the issue-9 restructure (tests/fixtures/README.md: commit 0c2c7f0,
2 ranks, ZeRO-2, checkpoint global_step5) read, exported and resumed by today's code.

Its data position is data state format 1, which the data pipeline's format 2 (global mixing) refuses
to continue by design; the launcher checks that before any compute and says so. Everything the
launcher itself wrote (sidecar, DeepSpeed and RNG files, config.yaml, stages.json) still loads: the
resume test gives the stored run a fresh data position and trains on from its checkpoint.
"""
from __future__ import annotations

import json

import pytest
import torch
import yaml

from launcher.run_dir import RunDir, sidecar_path
from launcher.sidecar import read_sidecar, write_sidecar
from launcher.train.metrics import read_metrics
from roformer.hf_interop import load_pretrained
from tests.helpers import REPO, TEST_RANK_ENTRY, run_to_end, write_schedule, write_yaml

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


def _resume_config(run_dir, extra_steps: int = 3):
    """The stored run's own config (its model, data and seeds) with a third stage to train, its paths
    pointing at this machine's copies."""
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["data"]["data_dir"] = str(run_dir.parent / "data")
    config["deepspeed"]["config"] = str(REPO / "ds_configs" / "cpu_fp32_zero2.json")
    stages = json.loads((run_dir / "stages.json").read_text())["stages"]
    schedule = [{k: s[k] for k in ("name", "max_seq_len", "global_batch_size", "steps")} for s in stages]
    schedule.append({"name": "more", "max_seq_len": 32, "global_batch_size": 8, "steps": extra_steps})
    config["schedule"]["file"] = str(write_schedule(run_dir.parent / "resume_schedule.yaml", schedule))
    config["logging"]["progress_bar"] = False
    return write_yaml(run_dir.parent / "resume.yaml", config)


def test_stored_data_position_is_refused_before_any_compute(stored_run, copy_of, monkeypatch, capsys):
    from launcher.train import rank_entry

    run_dir = copy_of(stored_run.parent) / "run"
    # heartbeats/: the hang watchdog's liveness files, rewritten by every launch (not run records)
    before = {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir() if p.name != "heartbeats"}
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert rank_entry.main(["--config", str(_resume_config(run_dir)), "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("pretrain (rank 0): error: ") and "data state format 1" in err
    assert {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir() if p.name != "heartbeats"} == before


@pytest.mark.multiprocess
def test_stored_run_resumes_from_its_checkpoint_and_exports(stored_run, copy_of, tmp_path):
    from data_pipeline import MaskingConfig, PretrainBatches, open_corpus
    from launcher.downstream.export import export_checkpoint

    run_dir = copy_of(stored_run.parent) / "run"
    config = _resume_config(run_dir)
    cfg = yaml.safe_load(config.read_text())
    fresh = PretrainBatches(open_corpus(cfg["data"]["data_dir"], split="train"), rank=0, world_size=2,
                            seed=cfg["data"]["seed"], masking=MaskingConfig()).state_dict()
    path = sidecar_path(run_dir / "checkpoints" / TAG)
    path.write_text(json.dumps({**json.loads(path.read_text()), "data_state": fresh}, indent=2))

    run_to_end(2, config, run_dir, module=TEST_RANK_ENTRY)
    (resume,) = [r for r in read_metrics(run_dir, "event") if r["event"] == "resume"]
    assert (resume["tag"], resume["from_world_size"], resume["world_size"], resume["universal"]) == (TAG, 2, 2, False)
    steps = [r["step"] for r in read_metrics(run_dir, "train")]
    # 1-5 kept from the stored run's metrics.jsonl (written 0-based, rewritten as steps completed), 6-8 trained now
    assert steps == list(range(1, 9))
    final = read_sidecar(RunDir(run_dir).checkpoint("global_step8"))
    assert (final.step, final.consumed_samples, final.stage_name) == (8, 32 + 3 * 8, "more")
    out = export_checkpoint(run_dir, tmp_path / "export")
    assert json.loads((out / "export_info.json").read_text())["step"] == 8

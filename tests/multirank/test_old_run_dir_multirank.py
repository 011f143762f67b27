"""Run directories written by earlier code (tests/fixtures/README.md) resumed and exported by today's, 2 ranks.

Everything the launcher wrote (sidecar, DeepSpeed and RNG files, config.yaml, stages.json) still loads; the
stored data position is of a format the data pipeline refuses by design, so the resume gets a fresh one.
"""
from __future__ import annotations

import json

import yaml

from launcher.run_dir.layout import RunDir, sidecar_path
from launcher.checkpoint.catalogue import read_sidecar
from launcher.train.metrics import read_metrics
from tests.support.helpers import TEST_RANK_ENTRY, run_to_end, stored_run_resume_config

TAG = "global_step5"


def test_stored_run_resumes_from_its_checkpoint_and_exports(stored_run, copy_of, tmp_path):
    from data_pipeline import MaskingConfig, PretrainBatches, open_corpus
    from launcher.export.exporter import export_checkpoint

    run_dir = copy_of(stored_run.parent) / "run"
    config = stored_run_resume_config(run_dir)
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


def test_release_run_resumes_and_exports(release_run, copy_of, tmp_path):
    """The release the start-up work began from (the same formats as the one before the checkpoint component,
    whose files tests/unit/test_old_run_dir.py verifies and exports): its checkpoint (format-2 sidecar, data
    state format 2) resumes as it is, the config change is recorded as a new version, and the result exports."""
    from launcher.export.exporter import export_checkpoint

    run_dir = copy_of(release_run.parent) / "run"
    config = stored_run_resume_config(run_dir)
    run_to_end(2, config, run_dir, module=TEST_RANK_ENTRY)
    (resume,) = [r for r in read_metrics(run_dir, "event") if r["event"] == "resume"]
    assert (resume["tag"], resume["from_world_size"], resume["world_size"], resume["universal"]) == (TAG, 2, 2, False)
    assert [r["step"] for r in read_metrics(run_dir, "train")] == list(range(1, 9))
    final = read_sidecar(RunDir(run_dir).checkpoint("global_step8"))
    assert (final.step, final.consumed_samples, final.stage_name) == (8, 32 + 3 * 8, "more")
    versions = json.loads((run_dir / "config_versions.json").read_text())["versions"]
    assert [(v["version"], v["from_step"], v["resumed_from"]) for v in versions] == [(1, 0, None), (2, 5, TAG)]
    out = export_checkpoint(run_dir, tmp_path / "export")
    assert json.loads((out / "export_info.json").read_text())["step"] == 8

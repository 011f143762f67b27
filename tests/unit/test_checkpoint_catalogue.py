"""The checkpoint catalogue (launcher/checkpoint/catalogue.py) on hand-made run directories:
states, order, the newest intact checkpoint (verified once), and what retention deletes."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.checkpoint import catalogue as checkpoint_catalogue
from launcher.checkpoint.catalogue import CheckpointCatalogue
from launcher.checkpoint.catalogue import record_files, write_save_record
from launcher.run_dir.layout import RunDir, sidecar_path, tag_for_step
from launcher.checkpoint.catalogue import SIDECAR_FORMAT
from tests.support.helpers import REPO, write_complete_checkpoint


def make_checkpoint(run_dir: RunDir, step: int, tag: str | None = None) -> Path:
    """checkpoints/<tag> with two small files and a format-2 sidecar recording them."""
    directory = run_dir.checkpoint(tag or tag_for_step(step))
    directory.mkdir(parents=True)
    (directory / "mp_rank_00_model_states.pt").write_bytes(b"model" * (step + 1))
    (directory / "rng_rank0.pt").write_bytes(b"rng")
    return write_complete_checkpoint(run_dir, step, record_files(directory, ["mp_rank_00_model_states.pt",
                                                                           "rng_rank0.pt"]), tag=directory.name)


@pytest.fixture
def run_dir(tmp_path) -> RunDir:
    """Complete checkpoints at steps 2, 4, 10 and 12; a partial save at 6; an unreadable sidecar at 8."""
    layout = RunDir(tmp_path / "run")
    for step in (2, 4, 10, 12):
        make_checkpoint(layout, step)
    partial = layout.checkpoint(tag_for_step(6))
    write_save_record(partial, partial.name)
    (partial / "mp_rank_00_model_states.pt").write_bytes(b"half")
    sidecar_path(make_checkpoint(layout, 8)).write_text('{"tag": "global_step8", "step": ')
    return layout


def damage(run_dir: RunDir, step: int) -> None:
    model = run_dir.checkpoint(tag_for_step(step)) / "mp_rank_00_model_states.pt"
    model.write_bytes(model.read_bytes()[:3])


def test_one_scan_lists_every_checkpoint_in_step_order_with_its_state(run_dir):
    (run_dir.damaged / "global_step3-20260101T000000").mkdir(parents=True)  # set aside: not an entry
    (run_dir.checkpoints / ".global_step14.partial").mkdir()
    make_checkpoint(run_dir, 5, tag="global_step7")  # a sidecar for another tag
    catalogue = CheckpointCatalogue.scan(run_dir.root)  # a path does as well as a RunDir
    assert [(e.tag, e.step, e.state) for e in catalogue.entries] == [
        ("global_step2", 2, "complete"), ("global_step4", 4, "complete"), ("global_step6", 6, "partial"),
        ("global_step7", 7, "damaged"), ("global_step8", 8, "damaged"), ("global_step10", 10, "complete"),
        ("global_step12", 12, "complete")]  # by step, not by name
    by_tag = {e.tag: e for e in catalogue.entries}
    assert by_tag["global_step6"].problem.endswith("partial checkpoint: sidecar.json missing (the save did not finish)")
    assert "tag 'global_step5' is not the directory's name" in by_tag["global_step7"].problem
    assert "not valid JSON" in by_tag["global_step8"].problem and by_tag["global_step8"].sidecar is None
    assert by_tag["global_step12"].sidecar.consumed_samples == 96 and by_tag["global_step12"].problem is None
    assert [e.step for e in catalogue.complete()] == [2, 4, 10, 12]
    assert not any(e.verified for e in catalogue.entries)  # a scan hashes nothing


def test_newest_intact_skips_damaged_files_and_verifies_each_entry_once(run_dir, monkeypatch):
    damage(run_dir, 12)
    verified = []
    real_verify = checkpoint_catalogue.verify_files
    monkeypatch.setattr(checkpoint_catalogue, "verify_files",
                        lambda directory, sidecar: (verified.append(directory.name), real_verify(directory, sidecar)))
    catalogue = CheckpointCatalogue.scan(run_dir)
    point = catalogue.newest_intact()
    assert (point.tag, point.verified) == ("global_step10", True)
    newest = catalogue.entry("global_step12")
    assert newest.state == "damaged" and "mp_rank_00_model_states.pt: 3 bytes" in newest.problem
    assert newest.sidecar.step == 12  # still says what it was
    assert [d.tag for d in catalogue.damaged()] == ["global_step8", "global_step12"]
    assert catalogue.newest_intact() == point and catalogue.verify(point) == point
    assert verified == ["global_step12", "global_step10"]  # the older ones were never read; nothing twice
    assert catalogue.newest_intact(at_or_before=9).tag == "global_step4"
    assert catalogue.newest_intact(at_or_before=1) is None
    assert verified == ["global_step12", "global_step10", "global_step4"]


def test_no_intact_checkpoint(tmp_path):
    assert CheckpointCatalogue.scan(tmp_path / "fresh").entries == ()  # no checkpoints/ yet
    layout = RunDir(tmp_path / "run")
    make_checkpoint(layout, 4)
    damage(layout, 4)
    catalogue = CheckpointCatalogue.scan(layout)
    assert catalogue.newest_intact() is None and [d.tag for d in catalogue.damaged()] == ["global_step4"]


def test_to_prune_keeps_the_newest_and_the_protected(run_dir):
    catalogue = CheckpointCatalogue.scan(run_dir)
    # The partial and damaged leftovers older than the newest complete one go too.
    assert [e.tag for e in catalogue.to_prune(keep_last=2)] == ["global_step2", "global_step4", "global_step6",
                                                                "global_step8"]
    assert [e.tag for e in catalogue.to_prune(keep_last=2, protect_steps=[4, 8])] == ["global_step2", "global_step6"]
    assert [e.tag for e in catalogue.to_prune(keep_last=1, protect_steps={10})] == \
        ["global_step2", "global_step4", "global_step6", "global_step8"]
    make_checkpoint(run_dir, 14)
    sidecar_path(run_dir.checkpoint("global_step14")).unlink()  # a save in progress, newer than all: kept
    assert "global_step14" not in [e.tag for e in CheckpointCatalogue.scan(run_dir).to_prune(keep_last=1)]
    with pytest.raises(ValueError, match="keep_last 0"):
        catalogue.to_prune(keep_last=0)


def test_a_newer_sidecar_format_is_neither_resumed_nor_pruned(run_dir):
    path = sidecar_path(run_dir.checkpoint("global_step4"))
    path.write_text(json.dumps({**json.loads(path.read_text()), "format": SIDECAR_FORMAT + 1}))
    catalogue = CheckpointCatalogue.scan(run_dir)
    [newer] = catalogue.newer()
    assert newer.tag == "global_step4" and "newer than this release reads" in newer.problem
    assert "global_step4" not in [e.tag for e in catalogue.to_prune(keep_last=1)]
    assert "global_step4" not in [e.tag for e in catalogue.complete() + catalogue.damaged()]


def test_the_catalogue_imports_no_torch():
    code = ("import sys, launcher.checkpoint.catalogue, launcher.report.run_summary; "
            "print(sorted(m for m in ('torch', 'deepspeed') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True).stdout
    assert out.strip() == "[]"

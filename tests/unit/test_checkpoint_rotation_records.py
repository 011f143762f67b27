"""Checkpoint rotation deletes and moves only what the run's own records name (issue 63 item 3): a folder under
checkpoints/ without our sidecar or save record is left in place and named once; a file a user put into one of
our checkpoints survives its rotation; checkpoints/damaged/ only ever receives checkpoints this run wrote.
Real files on disk, the real catalogue, pruning and save preparation (no DeepSpeed needed for those)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from launcher.checkpoint.catalogue import CheckpointCatalogue, record_files, write_save_record
from launcher.checkpoint.checkpointer import clear_for_save, prune
from launcher.common.errors import UserError
from launcher.run_dir.layout import RunDir, save_record_path, sidecar_path, tag_for_step
from tests.support.helpers import write_complete_checkpoint


def ours(run_dir: RunDir, step: int) -> Path:
    """A checkpoint as a save of this run leaves it: save record, files, a sidecar recording them."""
    directory = run_dir.checkpoint(tag_for_step(step))
    write_save_record(directory, directory.name)
    (directory / "mp_rank_00_model_states.pt").write_bytes(b"model" * (step + 1))
    (directory / "rng_rank0.pt").write_bytes(b"rng")
    return write_complete_checkpoint(run_dir, step, record_files(directory, ["mp_rank_00_model_states.pt",
                                                                           "rng_rank0.pt"]))


@pytest.fixture
def run_dir(tmp_path) -> RunDir:
    """Our checkpoints at steps 4, 6 and 8; the issue's user folders: checkpoints/global_step2/notes.txt, and the
    copies mybest/ (of global_step4) and global_step6.bak/ (of global_step6)."""
    layout = RunDir(tmp_path / "run")
    for step in (4, 6, 8):
        ours(layout, step)
    notes = layout.checkpoint("global_step2")
    notes.mkdir()
    (notes / "notes.txt").write_text("lr 3e-4 looked better\n")
    shutil.copytree(layout.checkpoint("global_step4"), layout.checkpoint("mybest"))
    shutil.copytree(layout.checkpoint("global_step6"), layout.checkpoint("global_step6.bak"))
    return layout


def listing(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_rotation_leaves_folders_that_are_not_ours_and_names_each_once(run_dir, capsys):
    user_files = {name: data for name, data in listing(run_dir.checkpoints).items()
                  if name.split("/")[0] in ("global_step2", "mybest", "global_step6.bak")}
    catalogue = CheckpointCatalogue.scan(run_dir)
    states = {e.tag: e.state for e in catalogue.entries}
    assert states == {"mybest": "foreign", "global_step2": "foreign", "global_step4": "complete",
                      "global_step6.bak": "foreign", "global_step6": "complete", "global_step8": "complete"}
    assert catalogue.damaged() == []  # the copies are not damaged checkpoints of ours: nothing is set aside
    named: set[str] = set()
    assert prune(run_dir, keep_last=1, named=named) == ["global_step4", "global_step6"]
    err = capsys.readouterr().err.splitlines()
    assert sorted(line.split("checkpoints/")[1].split(":")[0] for line in err) == \
        ["global_step2", "global_step6.bak", "mybest"]
    assert all("not a checkpoint this run wrote" in line and "left in place" in line for line in err)
    assert "(its saves are global_step<N>)" in next(line for line in err if "global_step6.bak" in line)
    after = listing(run_dir.checkpoints)
    assert {name: after.get(name) for name in user_files} == user_files  # every byte of the user's still there
    assert not run_dir.checkpoint("global_step4").exists() and not run_dir.checkpoint("global_step6").exists()
    assert not run_dir.damaged.exists()
    ours(run_dir, 10)
    assert prune(run_dir, keep_last=1, named=named) == ["global_step8"]
    assert capsys.readouterr().err == ""  # named once: the next rotation says nothing about them again
    shutil.copytree(run_dir.checkpoint("global_step10"), run_dir.checkpoint("global_step9"))  # a copy, by its records
    ours(run_dir, 12)
    assert prune(run_dir, keep_last=1, named=named) == ["global_step10"]
    assert "global_step9: not a checkpoint this run wrote (a copy of global_step10)" in capsys.readouterr().err
    assert run_dir.checkpoint("global_step9").is_dir()


def test_a_file_added_to_one_of_our_checkpoints_survives_its_rotation(run_dir, capsys):
    extra = run_dir.checkpoint("global_step4") / "notes.txt"
    extra.write_text("keep me")
    prune(run_dir, keep_last=2, named=set())
    assert extra.read_text() == "keep me"
    assert sorted(p.name for p in extra.parent.iterdir()) == ["notes.txt"]  # only what the save wrote went
    assert "kept for what its save did not write: notes.txt" in capsys.readouterr().err
    assert CheckpointCatalogue.scan(run_dir).entry("global_step4").state == "foreign"  # never touched again


def test_a_partial_save_of_ours_is_pruned_and_damaged_is_only_ours(run_dir):
    partial = run_dir.checkpoint("global_step5")
    write_save_record(partial, partial.name)  # a save killed before its sidecar
    (partial / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"half")
    sidecar_path(run_dir.checkpoint("global_step6")).write_text("{not json")  # ours, damaged
    catalogue = CheckpointCatalogue.scan(run_dir)
    assert [e.tag for e in catalogue.damaged()] == ["global_step6"]
    assert "global_step5" in [e.tag for e in catalogue.to_prune(keep_last=1)]
    prune(run_dir, keep_last=1, named=set())
    assert not partial.exists()


def test_a_save_never_writes_into_a_folder_that_is_not_ours(run_dir):
    folder = run_dir.checkpoint("global_step12")
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    # At start-up, before any compute: a run at step 8 would save there.
    with pytest.raises(UserError, match=r"global_step12: not a checkpoint this run wrote .*a save of step 12 would "
                                        r"write there: move it out of .*checkpoints"):
        CheckpointCatalogue.scan(run_dir).refuse_foreign_ahead(8)
    CheckpointCatalogue.scan(run_dir).refuse_foreign_ahead(12)  # behind the start: left alone, no refusal
    # Appearing mid-run: the save is refused (every rank gets the line), the folder stays as it was.
    line = clear_for_save(run_dir, folder, "global_step12")
    assert "not a checkpoint this run wrote" in line and "a save of step 12 writes there" in line
    assert listing(folder) == {"notes.txt": b"mine"}
    # A partial save of ours there goes, and the new save's record is written first.
    partial = run_dir.checkpoint("global_step14")
    write_save_record(partial, partial.name)
    (partial / "mp_rank_00_model_states.pt").write_bytes(b"half")
    assert clear_for_save(run_dir, partial, "global_step14") is None
    assert sorted(p.name for p in partial.iterdir()) == [save_record_path(partial).name]

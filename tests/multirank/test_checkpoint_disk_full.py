"""A full disk while a checkpoint is being written (issue 20, section 4): a real 2-rank resume of the
session run on a small tmpfs that holds the run and half a checkpoint more. The save fails in
DeepSpeed's torch.save on a real ENOSPC; the job ends with one line naming it, the partial checkpoint
is removed, the previous one is untouched and `latest` unmoved; with space again, the run resumes
from that checkpoint and finishes.

Needs to mount a tmpfs (root, or CAP_SYS_ADMIN): skipped, saying why, only where the kernel refuses."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from launcher.checkpoint.catalogue import verify_files
from launcher.run_dir.layout import RunDir
from launcher.checkpoint.catalogue import read_sidecar
from tests.support.helpers import TEST_RANK_ENTRY, events, start_run, write_yaml

TIMEOUT = 600


def _mount(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["mount", *args], capture_output=True, text=True)


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs mount point (1 GiB to start with; the test shrinks it)."""
    point = tmp_path / "disk"
    point.mkdir()
    mounted = _mount("-t", "tmpfs", "-o", "size=1g", "tmpfs", str(point))
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (root or CAP_SYS_ADMIN needed): {mounted.stderr.strip()}")
    yield point
    subprocess.run(["umount", "-l", str(point)], capture_output=True)


def _resize(point: Path, size_bytes: int) -> None:
    size_kib = -(-size_bytes // 4096) * 4  # whole pages
    resized = _mount("-o", f"remount,size={size_kib}k", str(point))
    assert resized.returncode == 0, resized.stderr


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def test_a_full_disk_during_a_save_ends_in_one_line_and_keeps_the_previous_checkpoint(trainer_run, small_disk,
                                                                                      tmp_path):
    run_dir = small_disk / "run"
    shutil.copytree(trainer_run, run_dir)
    layout = RunDir(run_dir)
    shutil.rmtree(layout.checkpoint("global_step16"))  # resume from 12; the next save (16) meets the full disk
    layout.latest.write_text("global_step12")
    previous = layout.checkpoint("global_step12")
    before = {p.name: p.read_bytes() for p in previous.iterdir()}
    config = write_yaml(tmp_path / "resume.yaml", yaml.safe_load((trainer_run.parent / "run.yaml").read_text()))

    checkpoint_bytes = _tree_bytes(previous)
    _resize(small_disk, used_bytes(small_disk) + checkpoint_bytes // 2)
    log = tmp_path / "full.log"
    proc = start_run(2, config, run_dir, module=TEST_RANK_ENTRY, log=log)
    rc = proc.wait(timeout=TIMEOUT)
    output = log.read_text(errors="replace")
    assert rc != 0, output[-4000:]

    lines = [line for line in output.splitlines() if line.startswith("pretrain (rank 0): error: ")]
    assert len(lines) == 1, output[-4000:]
    line = lines[0]
    assert line.startswith(f"pretrain (rank 0): error: checkpoint global_step16 could not be written to "
                           f"{layout.checkpoints} (rank "), line
    assert re.search(r"\(rank [01]: (the filesystem is full \([\d,]+ kB free\): |No space left on device)", line), line
    assert line.endswith("its partial files were removed and checkpoints/latest still names global_step12, "
                         "untouched: free space, then run the same command to resume"), line
    assert "Traceback" not in output, output[-4000:]

    assert not layout.checkpoint("global_step16").exists()  # the partial checkpoint is gone
    assert layout.latest.read_text() == "global_step12"
    assert {p.name: p.read_bytes() for p in previous.iterdir()} == before
    verify_files(previous, read_sidecar(previous))  # still what its save recorded

    _resize(small_disk, 1 << 30)  # space again: the same command resumes from global_step12 and finishes
    proc = start_run(2, config, run_dir, module=TEST_RANK_ENTRY, log=tmp_path / "resumed.log")
    assert proc.wait(timeout=TIMEOUT) == 0, (tmp_path / "resumed.log").read_text(errors="replace")[-4000:]
    assert [e["tag"] for e in events(run_dir, "resume")][-2:] == ["global_step12", "global_step12"]
    assert layout.latest.read_text() == "global_step16"
    verify_files(layout.checkpoint("global_step16"), read_sidecar(layout.checkpoint("global_step16")))


def used_bytes(point: Path) -> int:
    """Bytes in use on the filesystem at `point`."""
    usage = shutil.disk_usage(point)
    return usage.total - usage.free

"""Checkpoint integrity without a DeepSpeed job: what a save records, what verification catches,
which checkpoint a resume takes, what is set aside, and the order in which a save reaches the disk.

Checkpoints here are copies of the stored run's real ZeRO-2 files (tests/fixtures/README.md) with
format-2 sidecars written by the project's own writer; `fsync` and `rename` are observed through
the os module so that their ORDER can be checked (a power loss is not something a test can cause).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from launcher.checkpoint.catalogue import CheckpointCatalogue, DamagedCheckpoint, entry_of, verify_files
from launcher.checkpoint.catalogue import file_shares, record_files
from launcher.run_dir.layout import RunDir, sidecar_path
from launcher.checkpoint.catalogue import SIDECAR_FORMAT, read_sidecar, write_save_record, write_sidecar

STORED_TAG = "global_step5"


def make_checkpoint(run_dir: RunDir, stored_run: Path, step: int, tokenizer_sha256: str = "ab" * 32) -> Path:
    """checkpoints/global_step<step>: the stored run's files and a format-2 sidecar recording them."""
    directory = run_dir.checkpoint(f"global_step{step}")
    shutil.copytree(stored_run / "checkpoints" / STORED_TAG, directory)
    sidecar_path(directory).unlink()
    sidecar = read_sidecar(stored_run / "checkpoints" / STORED_TAG)
    sidecar.tag, sidecar.step, sidecar.format = directory.name, step, SIDECAR_FORMAT
    sidecar.tokenizer_sha256 = tokenizer_sha256
    sidecar.files = record_files(directory, sorted(p.name for p in directory.iterdir()))
    write_save_record(directory, directory.name)  # what a save writes first: the folder is this run's
    write_sidecar(directory, sidecar)
    return directory


@pytest.fixture
def run_dir(tmp_path, stored_run) -> RunDir:
    """A run directory with intact format-2 checkpoints at steps 3, 4 and 5."""
    layout = RunDir(tmp_path / "run")
    layout.checkpoints.mkdir(parents=True)
    (layout.root / "config.yaml").write_text((stored_run / "config.yaml").read_text())
    for step in (3, 4, 5):
        make_checkpoint(layout, stored_run, step)
    return layout


def truncate(path: Path, keep: int = 1000) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def test_format2_sidecar_records_every_file_and_reads_back(run_dir):
    directory = run_dir.checkpoint("global_step5")
    raw = json.loads(sidecar_path(directory).read_text())
    assert raw["format"] == 2 and raw["tokenizer_sha256"] == "ab" * 32
    names = sorted(p.name for p in directory.iterdir() if p.name not in ("sidecar.json", ".save.json"))
    assert sorted(raw["files"]) == names
    for name, record in raw["files"].items():
        assert record["bytes"] == (directory / name).stat().st_size and len(record["sha256"]) == 64
    sidecar = read_sidecar(directory)
    assert sidecar.files == raw["files"]
    verify_files(directory, sidecar)  # intact


@pytest.mark.parametrize("damage, message", [
    ("truncate", r"mp_rank_00_model_states\.pt: 1000 bytes, \d+ recorded at save time \(truncated\)"),
    ("flip", r"zero_pp_rank_1_mp_rank_00_optim_states\.pt: sha256 differs from the one recorded at save time"),
    ("delete", r"rng_rank0\.pt: missing \(recorded at save time in sidecar\.json\)"),
])
def test_verification_names_the_damaged_file(run_dir, damage, message):
    directory = run_dir.checkpoint("global_step5")
    if damage == "truncate":
        truncate(directory / "mp_rank_00_model_states.pt")
    elif damage == "flip":
        path = directory / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01  # same size: only the checksum can tell
        path.write_bytes(bytes(data))
    else:
        (directory / "rng_rank0.pt").unlink()
    with pytest.raises(DamagedCheckpoint, match=message):
        verify_files(directory, read_sidecar(directory))


def test_format1_sidecar_gets_the_presence_check(stored_run, tmp_path):
    directory = tmp_path / STORED_TAG
    shutil.copytree(stored_run / "checkpoints" / STORED_TAG, directory)
    sidecar = read_sidecar(directory)
    assert sidecar.format == 1 and sidecar.files is None and sidecar.tokenizer_sha256 is None
    verify_files(directory, sidecar)
    (directory / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    with pytest.raises(DamagedCheckpoint, match=r"optimizer shard\(s\) of rank\(s\) 1 missing"):
        verify_files(directory, sidecar)


def test_the_catalogue_tells_partial_from_damaged(run_dir):
    assert entry_of(run_dir.checkpoint("global_step5")).state == "complete"
    sidecar_path(run_dir.checkpoint("global_step4")).write_text('{"tag": "global_step4", "step": ')
    entry = entry_of(run_dir.checkpoint("global_step4"))
    assert entry.state == "damaged" and "not valid JSON" in entry.problem and entry.step == 4
    sidecar_path(run_dir.checkpoint("global_step3")).unlink()
    assert entry_of(run_dir.checkpoint("global_step3")).state == "partial"  # a save that did not finish


def test_a_newer_sidecar_format_is_refused_not_set_aside(run_dir):
    from launcher.checkpoint.catalogue import NewerSidecarFormat
    from launcher.checkpoint.resume import decide

    path = sidecar_path(run_dir.checkpoint("global_step5"))
    path.write_text(json.dumps({**json.loads(path.read_text()), "format": SIDECAR_FORMAT + 1}))
    with pytest.raises(NewerSidecarFormat, match=rf"{path}: sidecar format {SIDECAR_FORMAT + 1} is newer"):
        decide(run_dir, setup=None, batches=None)
    assert not run_dir.damaged.exists()


def test_resume_takes_the_newest_intact_checkpoint_and_lists_the_damaged(run_dir):
    truncate(run_dir.checkpoint("global_step5") / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    sidecar_path(run_dir.checkpoint("global_step4")).write_text("not json")
    catalogue = CheckpointCatalogue.scan(run_dir)
    point = catalogue.newest_intact()
    assert point.tag == "global_step3" and point.verified
    reasons = {d.tag: d.problem for d in catalogue.damaged()}
    assert set(reasons) == {"global_step4", "global_step5"}
    assert "zero_pp_rank_0_mp_rank_00_optim_states.pt" in reasons["global_step5"] and "truncated" in reasons["global_step5"]
    assert "sidecar.json: not valid JSON" in reasons["global_step4"]


def test_every_checkpoint_damaged_is_refused_and_nothing_moves(run_dir, tiny_data):
    from launcher.common.errors import UserError
    from launcher.checkpoint.resume import decide

    for step in (3, 4, 5):
        truncate(run_dir.checkpoint(f"global_step{step}") / "mp_rank_00_model_states.pt")
    before = sorted(p.name for p in run_dir.checkpoints.iterdir())
    with pytest.raises(UserError, match=r"no intact checkpoint to resume from: global_step\d: .*truncated"):
        decide(run_dir, setup=None, batches=None)
    assert sorted(p.name for p in run_dir.checkpoints.iterdir()) == before


def test_moved_aside_checkpoints_survive_pruning(run_dir):
    from launcher.checkpoint.catalogue import move_aside
    from launcher.checkpoint.checkpointer import prune

    dest = move_aside(run_dir, run_dir.checkpoint("global_step3"))
    assert dest.parent == run_dir.damaged and dest.name.startswith("global_step3-")
    assert prune(run_dir, keep_last=1) == ["global_step4"]
    assert (dest / "mp_rank_00_model_states.pt").is_file() and sidecar_path(dest).is_file()


def test_file_shares_split_a_save_by_bytes(run_dir):
    directory = run_dir.checkpoint("global_step5")
    shares = file_shares(directory, 2)
    names = sorted(n for share in shares for n in share)
    assert names == sorted(p.name for p in directory.iterdir() if p.name not in ("sidecar.json", ".save.json"))
    sizes = [sum((directory / n).stat().st_size for n in share) for share in shares]
    largest = max(p.stat().st_size for p in directory.iterdir())
    assert abs(sizes[0] - sizes[1]) <= largest  # greedy by size: no rank gets everything


# --------------------------------------------------------------------------- durability order


class DiskLog:
    """Records fsync (by path) and rename/replace calls of this process, in order."""

    def __init__(self, monkeypatch):
        self.events: list[tuple[str, str]] = []
        self.renamed_from: dict[str, str] = {}
        real_fsync, real_replace, real_rename = os.fsync, os.replace, os.rename

        def fsync(fd):
            self.events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
            return real_fsync(fd)

        def renaming(real):
            def rename(src, dst, **kw):
                dst = str(Path(dst).resolve())
                self.events.append(("rename", dst))
                self.renamed_from[dst] = str(Path(src).resolve())
                return real(src, dst, **kw)
            return rename

        replace, rename = renaming(real_replace), renaming(real_rename)

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", replace)
        monkeypatch.setattr(os, "rename", rename)

    def index(self, kind: str, path: Path) -> int:
        return next(i for i, e in enumerate(self.events) if e == (kind, str(Path(path).resolve())))

    def last_index(self, kind: str, path: Path) -> int:
        return max(i for i, e in enumerate(self.events) if e == (kind, str(Path(path).resolve())))


class OneRank:
    """deepspeed.comm for a single rank (the collectives of Checkpointer.save are identities)."""

    @staticmethod
    def barrier():
        pass

    @staticmethod
    def all_gather_object(out, obj):
        out[0] = obj

    @staticmethod
    def broadcast_object_list(objects, src=0):
        pass


class FileWritingEngine:
    """Writes files shaped like DeepSpeed's ZeRO-2 save (the stored run's) into the tag directory."""

    skipped_steps = 0
    optimizer = None
    config = {"zero_optimization": {"stage": 2}}  # the DeepSpeed config it was built from: fp32 (engine.precision)

    def __init__(self, source: Path):
        self.source = source

    def save_checkpoint(self, save_dir, tag, client_state, save_latest):
        target = Path(save_dir) / tag
        target.mkdir(parents=True, exist_ok=True)
        for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"):
            shutil.copyfile(self.source / name, target / name)

    def zero_optimization_stage(self):
        return 2

    def fp16_enabled(self):
        return False

    def bfloat16_enabled(self):
        return False


class Counters:
    def __init__(self, state):
        self.state = state

    def state_dict(self):
        return dict(self.state)


def test_a_save_reaches_the_disk_before_it_is_marked_complete(tmp_path, stored_run, monkeypatch):
    from launcher.config.stages import ResolvedStage
    from launcher.checkpoint import checkpointer as checkpointer_module
    from launcher.config.run_shape import RunShape
    from roformer.config import RoFormerConfig

    stored = read_sidecar(stored_run / "checkpoints" / STORED_TAG)
    run_dir = RunDir(tmp_path / "run")
    run_dir.checkpoints.mkdir(parents=True)
    monkeypatch.setattr(checkpointer_module, "dist", OneRank)
    train = Counters({"step": 7, "consumed_samples": 40, "consumed_tokens": 900, "last_validation": {}})
    run = checkpointer_module.CheckpointedRun(
        run_dir, rank=0, shape=RunShape(zero_stage=stored.zero_stage, precision=stored.precision, world_size=1),
        model_config=RoFormerConfig.from_dict(stored.model_config), total_steps=10, keep_last=2,
        tokenizer_sha256="cd" * 32)
    saver = checkpointer_module.Checkpointer(run, FileWritingEngine(stored_run / "checkpoints" / STORED_TAG), train,
                                             Counters(stored.data_state))
    stage = ResolvedStage(index=0, name="only", max_seq_len=64, global_batch_size=8, micro_batch_size=8,
                          grad_accum_steps=1, steps=10, first_step=0, lr_scale=1.0)
    disk = DiskLog(monkeypatch)
    tag = saver.save(stage)

    directory = run_dir.checkpoint(tag)
    sidecar_written = disk.index("rename", sidecar_path(directory))
    latest_moved = disk.index("rename", run_dir.latest)
    assert sidecar_written < latest_moved
    for path in [*directory.iterdir(), directory, run_dir.checkpoints]:
        if path.name not in ("sidecar.json", ".save.json"):  # the save record only names the folder ours
            assert disk.index("fsync", path) < sidecar_written, f"{path} not flushed before the sidecar"
    assert disk.last_index("fsync", run_dir.checkpoints) > latest_moved  # the renames themselves flushed too
    assert disk.last_index("fsync", directory) > sidecar_written
    sidecar = read_sidecar(directory)
    assert sidecar.tokenizer_sha256 == "cd" * 32
    assert sorted(sidecar.files) == ["mp_rank_00_model_states.pt", "rng_rank0.pt",
                                     "zero_pp_rank_0_mp_rank_00_optim_states.pt"]
    verify_files(directory, sidecar)


def test_an_export_is_flushed_before_and_after_it_appears(stored_run, tmp_path, monkeypatch):
    from launcher.export.exporter import export_checkpoint

    out = tmp_path / "exports" / "model"
    disk = DiskLog(monkeypatch)
    export_checkpoint(stored_run, out, verify=False)
    appeared = disk.index("rename", out)
    written_in = Path(disk.renamed_from[str(out.resolve())])  # the temporary directory it was built in
    for path in [*(written_in / p.name for p in out.iterdir()), written_in]:
        assert disk.index("fsync", path) < appeared, f"{path} not flushed before the export appeared"
    assert disk.last_index("fsync", out.parent) > appeared  # the new directory entry itself


def test_an_atomic_write_syncs_its_temp_file_once_then_its_directory(tmp_path, monkeypatch):
    """launcher/common/io.py: the temp file flushed once (issue 62 R6: it was twice), renamed, then the folder."""
    from launcher.common.io import atomic_write_json

    disk, path = DiskLog(monkeypatch), tmp_path / "record.json"
    atomic_write_json(path, {"step": 1})
    temp = str(tmp_path / f".record.json.tmp{os.getpid()}")
    assert disk.events == [("fsync", temp), ("rename", str(path)), ("fsync", str(tmp_path))], disk.events
    assert json.loads(path.read_text()) == {"step": 1}

"""Shards are hashed once (issue 12, item 5) and reach the disk before their manifest (item 1).

`open_corpus(verify=True)` used to re-hash every shard on every rank at every start; now a shard
whose size and mtime are those recorded when it was written is trusted, any other is re-hashed, and
in a run only rank 0 verifies. Hash calls are counted through data_pipeline.shards.file_sha256.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import data_pipeline.shards as shards
from data_pipeline import open_corpus
from data_pipeline.errors import DataError


@pytest.fixture
def hashed(monkeypatch) -> list[Path]:
    """The files open_corpus hashes, in order."""
    calls: list[Path] = []
    real = shards.file_sha256

    def counting(path, *args, **kwargs):
        calls.append(Path(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(shards, "file_sha256", counting)
    return calls


@pytest.fixture
def data_copy(tiny_data, tmp_path) -> Path:
    """A copy of the prepared tiny corpus with the files' mtimes kept (as `cp -a` / rsync -a do)."""
    return Path(shutil.copytree(tiny_data, tmp_path / "data"))


def shard_files(data_dir: Path, split: str = "train") -> list[Path]:
    return sorted((data_dir / split).glob("shard_*"))


def test_unchanged_shards_are_not_hashed_again(data_copy, hashed):
    manifest = json.loads((data_copy / "manifest.json").read_text())
    for entry in manifest["splits"]["train"]["shards"]:  # recorded when the shard was written
        assert entry["bin_mtime_ns"] == (data_copy / "train" / f"{entry['name']}.bin").stat().st_mtime_ns
        assert entry["idx_mtime_ns"] == (data_copy / "train" / f"{entry['name']}.idx").stat().st_mtime_ns
    corpus = open_corpus(data_copy, "train", verify=True)
    assert len(corpus.shards) > 1 and hashed == []


def test_a_touched_shard_is_hashed_and_a_changed_one_refused(data_copy, hashed):
    touched = data_copy / "train" / "shard_00001.bin"
    os.utime(touched, ns=(touched.stat().st_atime_ns, touched.stat().st_mtime_ns + 10**9))
    open_corpus(data_copy, "train", verify=True)
    assert hashed == [touched]  # same content: verified and accepted
    changed = data_copy / "train" / "shard_00002.bin"
    raw = bytearray(changed.read_bytes())
    raw[4] ^= 0x01
    changed.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=r"train/shard_00002\.bin: sha256 does not match the manifest"):
        open_corpus(data_copy, "train", verify=True)


def test_a_manifest_without_times_is_hashed_in_full(data_copy, hashed):
    path = data_copy / "manifest.json"
    manifest = json.loads(path.read_text())
    for split in manifest["splits"].values():
        for entry in split["shards"]:
            del entry["bin_mtime_ns"], entry["idx_mtime_ns"]
    path.write_text(json.dumps(manifest))
    open_corpus(data_copy, "train", verify=True)
    assert sorted(hashed) == shard_files(data_copy)


def test_in_a_run_only_rank_0_verifies_the_data(data_copy, hashed, tmp_path, monkeypatch):
    """Data prepared before the times were recorded (or copied without them): rank 0 hashes every
    shard once, the other ranks check structure and sizes only (the rank's input checks)."""
    from launcher.train.rank import check_inputs
    from tests.support.helpers import tiny_run_config

    for path in [*shard_files(data_copy, "train"), *shard_files(data_copy, "valid")]:
        os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))  # as after a plain cp
    args = ["--config", str(tiny_run_config(tmp_path, data_copy)), "--run-dir", str(tmp_path / "run")]
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    check_inputs(args)
    assert hashed == []
    monkeypatch.setenv("RANK", "0")
    check_inputs(args)
    assert not (tmp_path / "run").exists()  # the checks write nothing
    assert sorted(hashed) == sorted([*shard_files(data_copy, "train"), *shard_files(data_copy, "valid")])


def test_prepared_shards_reach_the_disk_before_the_manifest(tmp_path, monkeypatch):
    from data_pipeline.config import CleaningConfig, InputConfig, PrepareConfig
    from data_pipeline.prepare import prepare
    from tests.support.corpus_files import (
        TEST_TOKENIZER,
        english_paragraphs,
        write_jsonl,
    )
    from tests.unit.test_checkpoint_integrity import DiskLog

    source = write_jsonl(tmp_path / "en.jsonl", english_paragraphs(limit_files=4))
    out = tmp_path / "prepared"
    cfg = PrepareConfig(input=InputConfig(inputs=[str(source)]), out_dir=out, tokenizer=TEST_TOKENIZER,
                        shard_tokens=4000, workers=1, cleaning=CleaningConfig(valid_fraction=0.05))
    disk = DiskLog(monkeypatch)
    prepare(cfg, log=lambda msg: None)
    manifest_written = disk.index("rename", out / "manifest.json")
    flushed = [*shard_files(out, "train"), *shard_files(out, "valid"), *(out / "tokenizer").iterdir(),
               out / "train", out / "valid", out / "tokenizer"]
    assert len(flushed) > 8
    for path in flushed:
        assert disk.index("fsync", path) < manifest_written, f"{path} not flushed before the manifest"
    assert disk.last_index("fsync", out) > manifest_written  # the manifest's own directory entry

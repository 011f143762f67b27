"""The files of one checkpoint directory: checksums recorded at save time, verification before
anything loads it (`verify_files`: sizes and sha256 recorded in the sidecar; format-1 sidecars,
written before checksums were recorded, get the presence check of every rank's files), and moving a
damaged one aside to `checkpoints/damaged/<tag>-<time>`, never deleting it. Which checkpoints a run
holds and in which state (complete / partial / damaged) is launcher/run_dir/checkpoint_catalogue.py.

Checksums: sha256, like the data manifest and export_info.json; at save time every rank hashes
(and fsyncs) a share of about equal bytes, at resume rank 0 hashes the chosen checkpoint once.
Measured here under load (bench/results/startup.json): sha256 417 MB/s, crc32 1312 MB/s, blake2b
284 MB/s on one core. A BERT-base-sized ZeRO checkpoint (~1.8 GB) costs ~4 s to verify at
resume and a fraction of that per rank at save; crc32 would save ~3 s per start but not catch a
deliberately replaced file, so sha256 it is.
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

from launcher.errors import UserError
from launcher.io import file_sha256, fsync_dir, fsync_file
from launcher.run_dir.layout import SIDECAR_NAME, RunDir, sidecar_path
from launcher.run_dir.sidecar import CheckpointSidecar

_OPTIM_RANK = re.compile(r"zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$")
_ZERO3_MODEL_RANK = re.compile(r"^zero_pp_rank_(\d+)_mp_rank_\d+_model_states\.pt$")


class DamagedCheckpoint(UserError):
    """A checkpoint whose sidecar or files are not what its save wrote; the message names the file."""


class CheckpointWriteError(UserError):
    """A checkpoint could not be written (full disk, quota, I/O error): its partial directory was
    removed, the previous checkpoint and `latest` are as they were; the message says so in one line."""


# --------------------------------------------------------------------------- recording at save time


def file_shares(directory: Path, world_size: int) -> list[list[str]]:
    """The files of a checkpoint (sidecar excluded) split into `world_size` lists of about equal
    bytes, largest first, so the ranks hash a save in parallel."""
    files = sorted((p for p in directory.iterdir() if p.is_file() and p.name != SIDECAR_NAME
                    and not p.name.startswith(".")), key=lambda p: (-p.stat().st_size, p.name))
    shares: list[list[str]] = [[] for _ in range(world_size)]
    loads = [0] * world_size
    for path in files:
        least = loads.index(min(loads))
        shares[least].append(path.name)
        loads[least] += path.stat().st_size
    return shares


def record_files(directory: Path, names: list[str]) -> dict[str, dict]:
    """Size and sha256 of each file, each flushed to disk (fsync) on the way: name -> record."""
    records = {}
    for name in names:
        path = directory / name
        fsync_file(path)
        records[name] = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
    return records


# --------------------------------------------------------------------------- verification


def verify_files(directory: Path, sidecar: CheckpointSidecar) -> None:
    """DamagedCheckpoint naming the first file that is missing, has another size or another sha256
    than recorded at save time. Sizes are checked for every file before any is hashed (cheap first)."""
    if sidecar.files is None:  # format 1: nothing recorded, check that every rank's files are there
        check_rank_files(directory, sidecar.world_size)
        return
    where = f"{sidecar_path(directory)}: files"
    records = []
    for name, record in sorted(sidecar.files.items()):
        if (not isinstance(record, dict) or not isinstance(record.get("bytes"), int)
                or not isinstance(record.get("sha256"), str) or "/" in name):
            raise DamagedCheckpoint(f"{where}: entry {name!r} is not {{\"bytes\": int, \"sha256\": str}}")
        records.append((directory / name, record))
    for path, record in records:
        if not path.is_file():
            raise DamagedCheckpoint(f"{path}: missing (recorded at save time in {SIDECAR_NAME})")
        size = path.stat().st_size
        if size != record["bytes"]:
            raise DamagedCheckpoint(f"{path}: {size} bytes, {record['bytes']} recorded at save time "
                                    f"({'truncated' if size < record['bytes'] else 'grown'})")
    for path, record in records:
        if file_sha256(path) != record["sha256"]:
            raise DamagedCheckpoint(f"{path}: sha256 differs from the one recorded at save time (corrupted)")


def check_rank_files(tag_dir: Path, world_size: int) -> None:
    """Every rank's DeepSpeed files present (all a format-1 sidecar allows): a missing shard is
    reported by name, before any loading."""
    optim = sorted(p.name for p in tag_dir.glob("*_optim_states.pt"))
    models = sorted(p.name for p in tag_dir.glob("*_model_states.pt"))
    if (tag_dir / "zero").is_dir() and not optim:
        return  # universal checkpoint: checked per parameter when read
    if not models:
        raise DamagedCheckpoint(f"{tag_dir}: partial checkpoint: no model state file (mp_rank_00_model_states.pt "
                                f"for ZeRO 0-2, zero_pp_rank_N_mp_rank_00_model_states.pt for ZeRO-3)")
    if not optim:
        return  # ZeRO-0: the model state file holds the full weights
    ranks = sorted(int(m.group(1)) for m in map(_OPTIM_RANK.search, optim) if m)
    missing = sorted(set(range(world_size)) - set(ranks))
    if missing:
        raise DamagedCheckpoint(f"{tag_dir}: partial checkpoint: optimizer shard(s) of rank(s) "
                                f"{', '.join(map(str, missing))} missing (*zero_pp_rank_N_*_optim_states.pt)")
    zero3_model_ranks = {int(m.group(1)) for m in map(_ZERO3_MODEL_RANK.match, models) if m}
    if zero3_model_ranks:
        missing = sorted(set(range(world_size)) - zero3_model_ranks)
        if missing:
            raise DamagedCheckpoint(f"{tag_dir}: partial checkpoint: ZeRO-3 model state shard(s) of rank(s) "
                                    f"{', '.join(map(str, missing))} missing")
    elif not (tag_dir / "mp_rank_00_model_states.pt").is_file():
        raise DamagedCheckpoint(f"{tag_dir}: partial checkpoint: mp_rank_00_model_states.pt missing")


# --------------------------------------------------------------------------- setting aside


def move_aside(run_dir: RunDir, directory: Path) -> Path:
    """Move a damaged checkpoint to checkpoints/damaged/<tag>-<time> (retention never looks there);
    returns its new path."""
    run_dir.damaged.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    dest = run_dir.damaged / f"{directory.name}-{stamp}"
    suffix = 1
    while dest.exists():
        suffix += 1
        dest = run_dir.damaged / f"{directory.name}-{stamp}-{suffix}"
    os.rename(directory, dest)
    fsync_dir(run_dir.damaged)
    fsync_dir(directory.parent)
    return dest


# --------------------------------------------------------------------------- a save that failed


FULL_BELOW_BYTES = 1 << 20
"""A failed write with less than this free on its filesystem is reported as a full disk."""


def write_failure(rank: int, err: BaseException, directory: Path) -> str:
    """One line for a failed write of `rank` into `directory`: an OSError's strerror and file, else the
    error's first line. torch.save's zip writer does not pass the errno on (a full disk reads
    "[enforce fail at inline_container.cc:672] . unexpected pos 11648 vs 11542"), so the free space of
    the filesystem, taken now, says whether it was full."""
    import shutil

    if isinstance(err, OSError) and err.strerror:
        text = f"{err.strerror}{f' ({err.filename})' if err.filename else ''}"
    else:
        text = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:300]}"
    try:
        free = shutil.disk_usage(directory if directory.exists() else directory.parent).free
    except OSError:
        free = None
    if free is not None and free < FULL_BELOW_BYTES:
        text = f"the filesystem is full ({free / 1e3:,.0f} kB free): {text}"
    return f"rank {rank}: {text}"


def abandoned_save_message(run_dir: RunDir, tag: str, failure: str) -> str:
    """What a save that was given up says: what failed, the free space, what is left to resume from."""
    import shutil

    try:
        free = f"; {shutil.disk_usage(run_dir.checkpoints).free / 1e6:,.1f} MB free there now"
    except OSError:
        free = ""
    try:
        latest = run_dir.latest.read_text().strip()
        left = f"checkpoints/latest still names {latest}, untouched: free space, then run the same command to resume"
    except OSError:
        left = "there is no earlier complete checkpoint: free space, then run the same command to start again"
    return (f"checkpoint {tag} could not be written to {run_dir.checkpoints} ({failure}{free}); its partial files "
            f"were removed and {left}")


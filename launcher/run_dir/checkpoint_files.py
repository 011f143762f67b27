"""What a save writes into one checkpoint directory besides DeepSpeed's files: the size and sha256 of
every file (recorded in the sidecar), a failed save's one line; and moving a damaged checkpoint aside
to `checkpoints/damaged/<tag>-<time>`, never deleting it. Which checkpoints a run holds, in which
state, and whether their files are still what the save recorded (verification) is
launcher/run_dir/checkpoint_catalogue.py.

Checksums: sha256, like the data manifest and export_info.json; at save time every rank hashes
(and fsyncs) a share of about equal bytes, at resume rank 0 hashes the chosen checkpoint once.
Measured here under load (bench/results/startup.json): sha256 417 MB/s, crc32 1312 MB/s, blake2b
284 MB/s on one core. A BERT-base-sized ZeRO checkpoint (~1.8 GB) costs ~4 s to verify at
resume and a fraction of that per rank at save; crc32 would save ~3 s per start but not catch a
deliberately replaced file, so sha256 it is.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from launcher.errors import UserError
from launcher.io import file_sha256, fsync_dir, fsync_file
from launcher.run_dir.layout import SIDECAR_NAME, RunDir

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


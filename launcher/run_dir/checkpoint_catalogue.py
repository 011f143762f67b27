"""Which checkpoints a run directory holds, in which state, and which is newest: the one owner of
that question. One scan of `checkpoints/` gives a snapshot, a `CheckpointCatalogue`; the resume
decision (launcher/train/resume.py), retention (`Checkpointer.save` -> `to_prune`), the restart
record (launcher/launch/restart_loop.py), export, the reproduction's job runner and the run report
all read it, each with the filter it needs:

    catalogue = CheckpointCatalogue.scan(run_dir)
    catalogue.entries                   # every tag directory, oldest first (states below)
    catalogue.complete()                # complete sidecars, unverified (report, job runner)
    catalogue.newest_intact()           # the resume point: complete AND its files verify
    catalogue.newest_intact(at_or_before=step)   # the newest intact one from before a step (guard rewind)
    catalogue.to_prune(keep_last, protect_steps) # what keep_last retention deletes

States of `checkpoints/<tag>/` (checkpoints/damaged/ and hidden directories are not entries):
  complete  a valid sidecar with `complete: true` naming this tag; resumable and exportable once its
            files verify (`verify` -> `verify_files`: sizes and sha256 recorded at save time, sizes of
            every file before any is hashed; format 1, written before checksums were recorded: every
            rank's files present). Verification hashes every file (why sha256: checkpoint_files.py),
            so it runs at most once per entry and snapshot, and only where asked; a complete entry
            that fails it becomes `damaged`;
  partial   no sidecar.json: a save that did not finish (killed while writing); nothing was promised,
            a resumed run writes that step again and retention removes it once it is older than the
            newest complete one;
  damaged   a sidecar that exists but is unreadable, invalid, marked incomplete or for another tag,
            or files that failed verification: resume names it and moves it aside
            (checkpoint_files.move_aside), never deletes it;
  newer     a sidecar of a newer format than this release reads: not damaged, not ours to judge;
            never resumed from, pruned or set aside (resume refuses the run directory, naming it).

A snapshot is what was on disk at scan time: scan again after writing (a save, a move aside).
No torch here: the report renders from it without importing torch.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from launcher.errors import UserError
from launcher.io import file_sha256
from launcher.run_dir.layout import DAMAGED_DIR, SIDECAR_NAME, RunDir, step_of_tag
from launcher.run_dir.sidecar import CheckpointSidecar, MissingSidecar, NewerSidecarFormat, read_sidecar

COMPLETE, PARTIAL, DAMAGED, NEWER = "complete", "partial", "damaged", "newer"
_OPTIM_RANK = re.compile(r"zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$")
_ZERO3_MODEL_RANK = re.compile(r"^zero_pp_rank_(\d+)_mp_rank_\d+_model_states\.pt$")


class DamagedCheckpoint(UserError):
    """A checkpoint whose sidecar or files are not what its save wrote; the message names the file."""


@dataclass(frozen=True)
class CheckpointEntry:
    """One tag directory under checkpoints/ as the scan (and, once asked, verification) found it."""

    tag: str
    """The directory's name (global_step<N> for every checkpoint this project writes)."""
    step: int | None
    """Optimizer steps done: the sidecar's when complete, else read from the tag (None: a name that is
    not global_step<N>)."""
    path: Path
    """checkpoints/<tag>."""
    state: str
    """COMPLETE, PARTIAL, DAMAGED or NEWER (module docstring)."""
    sidecar: CheckpointSidecar | None = None
    """The parsed sidecar (complete entries, and damaged ones whose files failed verification)."""
    problem: str | None = None
    """Why it is not complete, one line naming the file (None for a complete entry)."""
    verified: bool = False
    """Its files matched the sidecar's records (set by `CheckpointCatalogue.verify`)."""


class CheckpointCatalogue:
    """A snapshot of a run directory's checkpoints: entries sorted by step (unnumbered tags first)."""

    def __init__(self, run_dir: RunDir, entries: Iterable[CheckpointEntry]):
        self.run_dir = run_dir
        self._entries = sorted(entries, key=lambda e: (e.step is not None, e.step or 0, e.tag))

    @classmethod
    def scan(cls, run_dir: RunDir | Path | str) -> "CheckpointCatalogue":
        """Read every tag directory's sidecar once (no file is hashed here)."""
        run_dir = run_dir if isinstance(run_dir, RunDir) else RunDir(Path(run_dir))
        if not run_dir.checkpoints.is_dir():
            return cls(run_dir, [])
        directories = (d for d in run_dir.checkpoints.iterdir()
                       if d.is_dir() and not d.name.startswith(".") and d.name != DAMAGED_DIR)
        return cls(run_dir, [entry_of(d) for d in directories])

    @property
    def entries(self) -> tuple[CheckpointEntry, ...]:
        """Every entry, oldest first, with the verification results known so far."""
        return tuple(self._entries)

    def entry(self, tag: str) -> CheckpointEntry | None:
        return next((e for e in self._entries if e.tag == tag), None)

    def complete(self) -> list[CheckpointEntry]:
        """Entries with a complete sidecar (files not verified unless asked), oldest first."""
        return [e for e in self._entries if e.state == COMPLETE]

    def damaged(self) -> list[CheckpointEntry]:
        """Entries found damaged: by their sidecar, or by a verification run on this snapshot."""
        return [e for e in self._entries if e.state == DAMAGED]

    def newer(self) -> list[CheckpointEntry]:
        """Entries whose sidecar a newer release wrote."""
        return [e for e in self._entries if e.state == NEWER]

    def verify(self, entry: CheckpointEntry) -> CheckpointEntry:
        """The entry with its files checked (once per snapshot): verified, or DAMAGED with the file named."""
        current = self.entry(entry.tag)
        if current is None:
            return entry
        checked = verified(current)
        self._entries[self._entries.index(current)] = checked
        return checked

    def newest_intact(self, at_or_before: int | None = None) -> CheckpointEntry | None:
        """The newest complete checkpoint whose files verify (at or before step `at_or_before` when
        given); newer complete ones that fail verification become DAMAGED in this snapshot (see
        `damaged()`), older ones are not read. None when there is none."""
        for entry in reversed(self.complete()):
            if at_or_before is not None and entry.step > at_or_before:
                continue
            checked = self.verify(entry)
            if checked.verified:
                return checked
        return None

    def to_prune(self, keep_last: int, protect_steps: Iterable[int] = ()) -> list[CheckpointEntry]:
        """What keep_last retention deletes: every complete checkpoint but the newest `keep_last`, and
        partial or damaged ones older than the newest complete one (leftovers of killed writes; a
        damaged one that a resume found is moved aside before, never deleted). Never an entry whose
        step is in `protect_steps` (the guard's newest checkpoint from before an open spike), nor a
        NEWER one. Sidecar-level states only: nothing is hashed to prune."""
        if keep_last < 1:
            raise ValueError(f"keep_last {keep_last}: the newest complete checkpoint is always kept (>= 1)")
        protected = set(protect_steps)
        complete = self.complete()
        doomed = complete[:-keep_last]
        if complete:
            newest = complete[-1].step
            doomed += [e for e in self._entries if e.state in (PARTIAL, DAMAGED) and e.step is not None
                       and e.step < newest]
        return sorted((e for e in doomed if e.step not in protected),
                      key=lambda e: (e.step is not None, e.step or 0, e.tag))


def entry_of(directory: Path) -> CheckpointEntry:
    """Sidecar-level state of one checkpoint directory (its files are checked by `verify`)."""
    tag = directory.name
    try:
        sidecar = read_sidecar(directory)
    except MissingSidecar as err:
        return CheckpointEntry(tag, step_of_tag(tag), directory, PARTIAL, problem=str(err))
    except NewerSidecarFormat as err:
        return CheckpointEntry(tag, step_of_tag(tag), directory, NEWER, problem=str(err))
    except (UserError, OSError) as err:
        return CheckpointEntry(tag, step_of_tag(tag), directory, DAMAGED, problem=str(err))
    if sidecar.tag != tag:
        return CheckpointEntry(tag, step_of_tag(tag), directory, DAMAGED,
                               problem=f"{directory / SIDECAR_NAME}: tag {sidecar.tag!r} is not the directory's name")
    return CheckpointEntry(tag, sidecar.step, directory, COMPLETE, sidecar=sidecar)


# --------------------------------------------------------------------------- verification


def verified(entry: CheckpointEntry) -> CheckpointEntry:
    """A complete `entry` with its files checked: verified, or DAMAGED with the file named (`verify_files`);
    any other entry as it is."""
    if entry.state != COMPLETE or entry.verified:
        return entry
    try:
        verify_files(entry.path, entry.sidecar)
    except DamagedCheckpoint as err:
        return dataclasses.replace(entry, state=DAMAGED, problem=str(err))
    return dataclasses.replace(entry, verified=True)


def verify_files(directory: Path, sidecar: CheckpointSidecar) -> None:
    """DamagedCheckpoint naming the first file that is missing, has another size or another sha256
    than recorded at save time. Sizes are checked for every file before any is hashed (cheap first)."""
    if sidecar.files is None:  # format 1: nothing recorded, check that every rank's files are there
        check_rank_files(directory, sidecar.world_size)
        return
    where = f"{directory / SIDECAR_NAME}: files"
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

"""What a checkpoint is on disk, and which checkpoints a run directory holds: the sidecar (its one
writer and reader), the catalogue (one scan of `checkpoints/`, verification, newest intact, what
retention drops), the file records a save writes into the sidecar, and moving a damaged checkpoint
aside. No torch here: the report and the launching machine read it without importing torch.

The sidecar, `checkpoints/<tag>/sidecar.json`, is written LAST by rank 0 after every rank wrote its
DeepSpeed files, so its presence (with `complete: true`) marks a finished save. It records where the
run is (step, stage, data position, counters), what was trained (model config, tokenizer sha256), how
(world size, precision, ZeRO stage, loss scale), and the size and sha256 of every other file of the
checkpoint. The same content (without the file records) goes into DeepSpeed's client state,
which a load checks against it. A format-1 sidecar (no checksums, no tokenizer) reads with those fields
None and round-trips unchanged.

    catalogue = CheckpointCatalogue.scan(run_dir)
    catalogue.entries                   # every tag directory, oldest first (states below)
    catalogue.complete()                # complete sidecars, unverified (report, job runner)
    catalogue.newest_intact()           # the resume point: complete AND its files verify
    catalogue.newest_intact(at_or_before=step)   # the guard's rewind point (`rewind_point`)
    catalogue.to_prune(keep_last, protect_steps) # what keep_last retention deletes
    owned_files(entry)                  # what removing it deletes: only what its save wrote

Which folders are ours is decided by the run's own records, never by a name alone: a save writes
`.save.json` naming its tag first (`write_save_record`) and the sidecar last; a folder whose sidecar or
save record names it is this run's checkpoint, anything else under checkpoints/ is FOREIGN.
States of `checkpoints/<tag>/` (checkpoints/damaged/ and hidden directories are not entries):
  complete  a valid sidecar with `complete: true` naming this tag; resumable and exportable once its
            files verify (`verify` -> `verify_files`: sizes and sha256 recorded at save time, sizes of
            every file before any is hashed; format 1: every rank's files present). Verification
            hashes every file, so it runs at most once per entry and snapshot, and only where asked;
            a complete entry that fails it becomes `damaged`;
  partial   no sidecar.json, and a save record or nothing but the files a save writes: a save that did
            not finish (killed while writing); nothing was promised,
            a resumed run writes that step again and retention removes it once it is older than the
            newest complete one;
  damaged   a save record of this tag and a sidecar that is unreadable, invalid, marked incomplete or for
            another tag, or a complete one whose files failed verification: resume names it and moves it
            aside (`move_aside`), never deletes it;
  foreign   not ours: a name other than global_step<N> (`mybest/`, `global_step6.bak/`), a copy of another
            checkpoint (its sidecar names another tag), a folder with neither sidecar nor save record
            (`global_step2/notes.txt`): never pruned, resumed or set aside; rotation names it once;
  newer     a sidecar of a newer format than this release reads: not damaged, not ours to judge;
            never resumed from, pruned or set aside (resume refuses the run directory, naming it).
A snapshot is what was on disk at scan time: scan again after writing (a save, a move aside).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from launcher.common.errors import UserError
from launcher.common.io import atomic_write_json, file_sha256, fsync_dir, fsync_file
from launcher.run_dir.layout import (DAMAGED_DIR, SAVE_RECORD_NAME, SIDECAR_NAME, RunDir, save_record_path,
                                     sidecar_path, step_of_tag)
from roformer.config import RoFormerConfig

SIDECAR_FORMAT = 2
COMPLETE, PARTIAL, DAMAGED, NEWER, FOREIGN = "complete", "partial", "damaged", "newer", "foreign"
# The files a save writes into its folder (DeepSpeed's, the RNG states, an atomic write's leftover): what
# removing a save whose sidecar records no files (a partial save, format 1) deletes, and nothing else.
_SAVE_FILES = re.compile(r"^(?:.+_model_states\.pt|.+_optim_states\.pt|rng_rank\d+\.pt|\..+\.tmp\d+)$")
_OPTIM_RANK = re.compile(r"zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$")
_ZERO3_MODEL_RANK = re.compile(r"^zero_pp_rank_(\d+)_mp_rank_\d+_model_states\.pt$")


class MissingSidecar(UserError):
    """No sidecar.json: a save that did not finish (a partial checkpoint, not a damaged one)."""


class NewerSidecarFormat(UserError):
    """A sidecar written by a newer release: not damaged, just not ours to read (refused, never set aside)."""


class DamagedCheckpoint(UserError):
    """A checkpoint whose sidecar or files are not what its save wrote; the message names the file."""


# --------------------------------------------------------------------------- the sidecar


@dataclass
class CheckpointSidecar:
    tag: str
    """Directory name under checkpoints/ (tag_for_step(step))."""
    step: int
    """Optimizer steps completed (skipped fp16 steps included) = index of the next step."""
    stage_index: int
    """0-based stage of the last step taken."""
    stage_name: str
    step_in_stage: int
    """Steps of that stage completed (1-based count)."""
    stage_complete: bool
    """The checkpoint is at the stage's end."""
    consumed_samples: int
    """Sequences trained on, over all ranks."""
    consumed_tokens: int
    """Non-padding tokens trained on, over all ranks."""
    last_validation: dict
    """Latest validation: step, stage, max_seq_len, loss, mlm_accuracy ({} before the first one)."""
    data_state: dict
    """data_pipeline.PretrainBatches.state_dict(): the global data position (same on every rank)."""
    model_config: dict
    """roformer.RoFormerConfig.to_dict() of the trained model."""
    world_size: int
    """Ranks that wrote the checkpoint (another world size resumes through a universal checkpoint)."""
    loss_scale: float
    """Dynamic fp16 loss scale at save time (1.0 for fp32 / bf16)."""
    skipped_steps: int
    """fp16 steps skipped on overflow so far."""
    zero_stage: int
    precision: str
    """"fp32", "fp16" or "bf16"."""
    total_steps: int
    """Steps of the whole schedule."""
    tokenizer_sha256: str | None = None
    """sha256 of the spm.model the run trained with (the data manifest's tokenizer.sha256): export
    packs only this tokenizer, resume refuses another. None in format 1."""
    files: dict | None = None
    """Every other file of the checkpoint directory: name -> {"bytes": size, "sha256": hex digest},
    recorded at save time after the files were flushed to disk. None in format 1."""
    rope_theta: float | None = None
    """RoPE base in force at this checkpoint (the stage's rope_theta, launcher/config/schedule.py): what
    export and evaluation must use. None for models without RoPE and in sidecars written before
    per-stage theta existed: then model_config's rope_theta is the one (same format number: a reader
    that predates the field ignores it)."""
    mask_prob: float | None = None
    """Share of tokens chosen for MLM in force at this checkpoint (the stage's mask_prob, else the run
    config's data.masking.mask_prob). None in sidecars written before per-stage mask rates: then the
    run config's rate was the only one (same format number: an older reader ignores the field)."""
    mixture: dict | None = None
    """The stage's data mixture in force at this checkpoint ({source: share}, shares summing to 1). None
    when the stage draws the sources by their size, and in sidecars written before mixtures existed."""
    noise_scale: dict | None = None
    """The gradient noise scale's running state (launcher/train/noise_scale.py NoiseEstimator.state_dict): the
    same on every rank. None when the run does not measure it, and in sidecars written before it existed."""
    complete: bool = True
    """Written last: False or absent means the save did not finish."""
    format: int = SIDECAR_FORMAT
    saved_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))

    def to_dict(self) -> dict:
        """The JSON object; optional fields that are None (a format-1 sidecar's) are left out."""
        return {k: v for k, v in dataclasses.asdict(self).items() if not (v is None and k in _OPTIONAL_FIELDS)}

    @classmethod
    def from_dict(cls, raw: object, where: str) -> "CheckpointSidecar":
        """Check every field's presence and type; errors name the file and the field."""
        if not isinstance(raw, dict):
            raise UserError(f"{where}: a sidecar is a JSON object")
        values = {}
        for f in dataclasses.fields(cls):
            if f.name not in raw:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise UserError(f"{where}: field '{f.name}' missing")
                continue
            value = raw[f.name]
            kind = _FIELD_TYPES[f.type.removesuffix(" | None")]
            if value is None and f.name in _OPTIONAL_FIELDS:
                values[f.name] = value
                continue
            if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
                raise UserError(f"{where}: field '{f.name}' must be {f.type}, got {value!r}")
            values[f.name] = value
        return cls(**values)


# Annotations are strings (postponed evaluation): the JSON types each stands for.
_FIELD_TYPES = {"str": str, "int": int, "bool": bool, "dict": dict, "float": (int, float)}
_OPTIONAL_FIELDS = frozenset(f.name for f in dataclasses.fields(CheckpointSidecar) if f.type.endswith(" | None"))


def effective_rope_theta(sidecar: CheckpointSidecar) -> float | None:
    """The RoPE base the checkpoint's weights were last trained with (None: not a RoPE model)."""
    if sidecar.rope_theta is not None:
        return sidecar.rope_theta
    return sidecar.model_config.get("rope_theta", 10000.0) if sidecar.model_config.get(
        "position_encoding", "rope") == "rope" else None


def saved_model_config(checkpoint_dir: Path, sidecar: CheckpointSidecar):
    """The RoFormerConfig the checkpoint was saved with: roformer.config.ConfigError naming this sidecar.json's
    model_config field when it is not one of this project's models (parsed here, when a resume asks, not when a
    sidecar is read: the report lists checkpoints whose model config this version may not know)."""
    return RoFormerConfig.from_dict(sidecar.model_config, source=f"{sidecar_path(checkpoint_dir)}: model_config")


def write_sidecar(checkpoint_dir: Path, sidecar: CheckpointSidecar) -> None:
    """The completion marker (call after every rank finished its files)."""
    atomic_write_json(sidecar_path(checkpoint_dir), sidecar.to_dict())


def read_sidecar(checkpoint_dir: Path) -> CheckpointSidecar:
    """The sidecar of a complete checkpoint; UserError naming the file and what is wrong otherwise."""
    path = sidecar_path(checkpoint_dir)
    if not path.is_file():
        raise MissingSidecar(f"{checkpoint_dir}: partial checkpoint: {SIDECAR_NAME} missing (the save did not finish)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: not valid JSON ({err})") from None
    if isinstance(raw, dict) and raw.get("complete") is not True:
        raise UserError(f"{path}: partial checkpoint: the sidecar says the save is not complete")
    sidecar = CheckpointSidecar.from_dict(raw, where=str(path))
    if sidecar.format > SIDECAR_FORMAT:
        raise NewerSidecarFormat(f"{path}: sidecar format {sidecar.format} is newer than this release reads "
                                 f"({SIDECAR_FORMAT}); use the release that wrote it")
    return sidecar


# --------------------------------------------------------------------------- the catalogue


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

    def foreign(self) -> list[CheckpointEntry]:
        """Folders under checkpoints/ that no record of this run names: never touched."""
        return [e for e in self._entries if e.state == FOREIGN]

    def refuse_foreign_ahead(self, step: int) -> None:
        """UserError naming a foreign global_step<N> folder with N > `step`, where a run starting at `step` may save."""
        ahead = [e for e in self.foreign() if e.step is not None and e.step > step]
        if ahead:
            more = f" (and {len(ahead) - 1} more)" if len(ahead) > 1 else ""
            raise UserError(f"{ahead[0].problem}, and a save of step {ahead[0].step} would write there: move it out "
                            f"of {self.run_dir.checkpoints}{more}")

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
        NEWER or FOREIGN one. Sidecar-level states only: nothing is hashed to prune."""
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
    """Sidecar-level state of one checkpoint directory (its files are checked by `verify`; states: module docstring)."""
    tag, step = directory.name, step_of_tag(directory.name)
    not_ours = f"{directory}: not a checkpoint this run wrote"
    if step is None:
        return CheckpointEntry(tag, None, directory, FOREIGN, problem=f"{not_ours} (its saves are global_step<N>)")
    started = save_record_tag(directory) == tag
    try:
        sidecar = read_sidecar(directory)
    except MissingSidecar as err:
        if started or all(p.is_file() and _SAVE_FILES.match(p.name) for p in directory.iterdir()):
            # ours, or (an older release's, which wrote no record) holding only what a save writes
            return CheckpointEntry(tag, step, directory, PARTIAL, problem=str(err))
        return CheckpointEntry(tag, step, directory, FOREIGN,
                               problem=f"{not_ours} (no {SIDECAR_NAME}, no {SAVE_RECORD_NAME} of a save)")
    except NewerSidecarFormat as err:
        return CheckpointEntry(tag, step, directory, NEWER, problem=str(err))
    except (UserError, OSError) as err:
        return CheckpointEntry(tag, step, directory, DAMAGED if started else FOREIGN,
                               problem=str(err) if started else f"{not_ours} (no {SAVE_RECORD_NAME}; {err})")
    if sidecar.tag != tag:
        if started:
            return CheckpointEntry(tag, step, directory, DAMAGED,
                                   problem=f"{directory / SIDECAR_NAME}: tag {sidecar.tag!r} is not the directory's name")
        return CheckpointEntry(tag, step, directory, FOREIGN, problem=f"{not_ours} (a copy of {sidecar.tag})")
    return CheckpointEntry(tag, sidecar.step, directory, COMPLETE, sidecar=sidecar)


def write_save_record(directory: Path, tag: str) -> None:
    """Rank 0, before any file of a save of `tag`: the record that makes `directory` this run's."""
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write_json(save_record_path(directory), {"tag": tag, "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})


def save_record_tag(directory: Path) -> str | None:
    """The tag the save record in `directory` names (None: none, or not one of ours)."""
    try:
        raw = json.loads(save_record_path(directory).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return raw.get("tag") if isinstance(raw, dict) and isinstance(raw.get("tag"), str) else None


def owned_files(entry: CheckpointEntry) -> list[Path]:
    """What the save of `entry` wrote (the sidecar's file records, else the names a save writes), the save record
    last: removed last, it keeps a half-removed folder ours. Nothing of a FOREIGN or NEWER entry, nor a user's file."""
    if entry.state not in (COMPLETE, PARTIAL, DAMAGED):
        return []
    records = entry.sidecar.files if entry.sidecar is not None else None
    names = set(records) if isinstance(records, dict) else {
        p.name for p in entry.path.iterdir() if p.is_file() and _SAVE_FILES.match(p.name)}
    names = {n for n in names if "/" not in n and n not in (SIDECAR_NAME, SAVE_RECORD_NAME)}
    return [entry.path / SIDECAR_NAME, *(entry.path / n for n in sorted(names)), save_record_path(entry.path)]


def rewind_point(run_dir: RunDir, at_or_before: int) -> CheckpointEntry | None:
    """The numerics guard's rewind point: the newest intact checkpoint at or before the step (files verified)."""
    return CheckpointCatalogue.scan(run_dir).newest_intact(at_or_before=at_or_before)


def newest_complete_before(run_dir: RunDir, step: int) -> CheckpointEntry | None:
    """The newest complete checkpoint from before `step` (sidecar level): what pruning keeps for an open spike."""
    before = [e for e in CheckpointCatalogue.scan(run_dir).complete() if e.step is not None and e.step < step]
    return before[-1] if before else None


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

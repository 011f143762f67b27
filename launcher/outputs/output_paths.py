"""Where a command may write: the one check of every command's output paths (docs/bad_inputs.md).

    check_paths(inputs={"--train": t, "--dev": d}, outputs={"--out": o, "--predictions": p})
    with publishing("--out", out, DATA, "roformer data prepare") as where:   # a directory it replaces or fills
        ...write into `where` (the resolved path), the writer lock held...

Refused, in one line naming the flag, before anything is read or written: an output equal to, inside
or containing an input or another output of the same command (the input would be overwritten, the
second output would replace the first, or a later read would take the output for input); a URL
(`s3://`, `hdfs://`, `http://` ...) where a local path is meant (it would become a local `./s3:/...`;
prepared data may be s3://: data.data_dir, `data prepare --out`, `data upload`); an output file that is a
directory, an output directory that is a file; a symbolic link to nothing; a target that is not writable
(permission bits, a read-only mount); a non-empty directory the command would replace or fill that is not
of its own kind, and one of its kind that holds anything it did not write (every entry counts: dotfiles,
nested folders, a file edited since). Paths are compared resolved (`~`, `..`, symbolic links), and kinds
are known by their own records (Kind), never by a folder name other tools use too. While a command writes,
it holds one writer lock per resolved output path (writer_lock), and removes what killed writers left.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from data_pipeline.errors import DataError
from data_pipeline.manifest import FORMAT_NAME, MANIFEST, SPLITS
from launcher.common.errors import UserError
from launcher.common.io import file_sha256, read_json_object
from launcher.common.local_paths import refuse_url
from launcher.outputs.locks import _lock_held, _read_small, writer_lock, writer_locks  # noqa: F401  (re-exported)
from launcher.run_dir.layout import RENDER_LOCK
from launcher.run_dir.lock import pid_alive

# The first line of a report.md of `roformer report` (launcher/report/run_report.py) and of `roformer
# reproduce` (launcher/reproduce/claims_report.py); both import it from here.
REPORT_TITLES = ("# Run report: ", "# RoFormer paper claims, reproduced at small scale")

@dataclass(frozen=True)
class Kind:
    """A kind of directory a command replaces or fills, known by its own records (never by a folder name
    other tools use as well: a `checkpoints/`, any `manifest.json`)."""

    name: str
    made_by: str
    recognise: Callable[[Path], bool]
    """True when the directory holds this kind's own records."""


def _is_prepared_data(path: Path) -> bool:
    return read_json_object(Path(path) / MANIFEST).get("format") == FORMAT_NAME


def export_record(path: Path) -> dict:
    """export_info.json of an export `roformer export` wrote ({} for anything else). Exports before the
    "format" field have run_dir, tag and step."""
    info = read_json_object(Path(path) / "export_info.json")
    ours = info.get("format") == "roformer-ds-export" or {"run_dir", "tag", "step"} <= set(info)
    return info if ours else {}


# Files only a run writes (a user's folder may well hold a config.yaml, a metrics.jsonl or a checkpoints/).
RUN_RECORDS = ("stages.json", "ds_config.resolved.json", "config_versions.json", "restarts.json", "init_from.json",
               "branch_from.json", ".deepspeed_env", "logs/launcher.log", "heartbeats/run.lock",
               "heartbeats/.run.lock.guard")


def is_run_dir(path: Path) -> bool:
    """A run directory of `roformer pretrain`, by the records only a run writes."""
    return any((Path(path) / record).exists() for record in RUN_RECORDS)


def _is_report(path: Path) -> bool:
    """report.md written by `roformer report` or `roformer reproduce` (their first line), or the plots'
    render lock file (`report --plots-only`)."""
    if (Path(path) / "plots" / RENDER_LOCK).is_file():
        return True
    try:
        with open(Path(path) / "report.md", encoding="utf-8") as f:
            first = f.readline()
    except (OSError, UnicodeDecodeError):
        return False
    return first.startswith(REPORT_TITLES)


REPRODUCTION_RECORD = "reproduction.json"
"""What `roformer reproduce` writes first into its --out: marks the folder as its own."""


def _is_reproduction(path: Path) -> bool:
    """By reproduction.json; an output of an earlier release by its results.json, or by its layout: prepared
    data in data/ and run directories in runs/."""
    path = Path(path)
    if read_json_object(path / REPRODUCTION_RECORD).get("format") == "roformer-ds-reproduction":
        return True
    results = read_json_object(path / "report" / "results.json")
    if isinstance(results.get("parts"), list) and "environment" in results:
        return True
    runs = path / "runs"
    return _is_prepared_data(path / "data") and runs.is_dir() and any(is_run_dir(run) for run in runs.iterdir())


DATA = Kind("prepared data", "roformer data prepare", _is_prepared_data)
EXPORT = Kind("export", "roformer export", lambda path: bool(export_record(path)))
RUN = Kind("run directory", "roformer pretrain", is_run_dir)
REPORT = Kind("report", "roformer report", _is_report)
REPRODUCTION = Kind("reproduction output", "roformer reproduce", _is_reproduction)
KINDS = (DATA, EXPORT, RUN, REPRODUCTION, REPORT)

EXPORT_ENTRIES = frozenset({
    "config.json", "model.safetensors", "pytorch_model.bin", "README.md", "export_info.json",
    "tokenizer", "spm.model", "spm.vocab", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "vocab.txt", "sentencepiece.bpe.model", "modules.json", "sentence_bert_config.json",
    "config_sentence_transformers.json", "1_Pooling", "2_Normalize", "model.safetensors.index.json",
    "added_tokens.json"})
"""What `roformer export` wrote at the top of an export before export_info.json recorded a sha256 per
file: anything else in such an export directory is the user's."""


def _flat(paths: dict) -> list[tuple[str, Path]]:
    flat = []
    for flag, value in paths.items():
        values = value if isinstance(value, (list, tuple)) else [value]
        for each in values:
            if each is None or each == "":
                continue
            refuse_url(flag, each)
            flat.append((flag, Path(each)))
    return flat


def _relation(a: Path, b: Path) -> str | None:
    """How path a stands to path b: 'is', 'is inside', 'contains', or None."""
    ra, rb = a.expanduser().resolve(), b.expanduser().resolve()
    if ra == rb:
        return "is"
    if ra.is_relative_to(rb):
        return "is inside"
    if rb.is_relative_to(ra):
        return "contains"
    return None


_NOUNS = {"RUN_DIR": "the run directory", "EXPORT": "the export", "--data": "the prepared data",
          "data.data_dir": "the prepared data", "--init-from": "the model the run starts from"}


def check_paths(inputs: dict, outputs: dict, may_hold: tuple[str, ...] = ()) -> None:
    """Refuse URLs, and an output that is, is inside or contains an input or another output.
    Values are paths, lists of paths or None (not given). `may_hold`: the flags of inputs that keep
    outputs inside them by design (RUN_DIR/export, RUN_DIR/report.md): only equal or containing is refused."""
    ins, outs = _flat(inputs), _flat(outputs)
    for i, (flag, out) in enumerate(outs):
        for other_flag, other in ins:
            how = _relation(out, other)
            if how == "is inside" and other_flag in may_hold:
                continue
            if how is not None:
                noun = _NOUNS.get(other_flag, "it")
                raise UserError(f"{flag} {out}: {how} the input {other_flag} {other}; writing there would "
                                f"{'replace' if how != 'is inside' else 'mix the output into'} {noun}: choose "
                                f"another {flag}")
        for other_flag, other in outs[i + 1:]:
            how = _relation(out, other)
            if how is not None:
                raise UserError(f"{flag} {out}: {how} {other_flag} {other} of the same command; one output would "
                                f"replace the other: give them different paths")


def resolved_output(flag: str, path) -> Path:
    """`path` with `~`, `..` and symbolic links resolved: where the command really writes, and what its
    lock and its checks are keyed on (`L -> S` and `S` are one directory). A link to nothing is refused:
    the write would land wherever it points, or fail once the work is done."""
    refuse_url(flag, path)
    path = Path(path).expanduser()
    if path.is_symlink() and not path.exists():
        raise UserError(f"{flag} {path}: a symbolic link to {os.readlink(path)}, which does not exist; give an "
                        f"existing directory or a new path")
    return path.resolve()


def check_output_file(flag: str, path: Path | None) -> None:
    """An output file: not a directory, its parent (if it exists) not a file, and writable."""
    if path is None:
        return
    resolved = resolved_output(flag, path)
    if resolved.is_dir():
        raise UserError(f"{flag} {path}: is a directory; give a file name (e.g. {path / 'report.json'})")
    for parent in resolved.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UserError(f"{flag} {path}: cannot create it: {parent} is a file, not a directory")
            break
    check_writable(flag, path, resolved)


def check_output_dir(flag: str, path: Path | None) -> None:
    """An output directory written into: not a file (nor below one), and writable."""
    if path is None:
        return
    resolved = resolved_output(flag, path)
    for each in (resolved, *resolved.parents):
        if each.exists():
            if not each.is_dir():
                raise UserError(f"{flag} {path}: exists and is not a directory" if each == resolved else
                                f"{flag} {path}: cannot create it: {each} is a file, not a directory")
            break
    check_writable(flag, path, resolved)


def check_writable(flag: str, path, resolved: Path, replaced: bool = False) -> None:
    """Where the command writes must be writable (access(2): permission bits and read-only mounts), or the
    work would end in an OSError: an existing directory itself, else the nearest folder above, where the
    path is created (a file is replaced there); with `replaced`, also the folder above a directory the
    command swaps whole (an export)."""
    existing = next(each for each in (resolved, *resolved.parents) if each.is_dir())
    places = [existing, resolved.parent] if replaced and existing == resolved else [existing]
    for place in places:
        if not os.access(place, os.W_OK | os.X_OK):
            where = "not writable" if place == resolved else f"cannot write there: {place} is not writable"
            raise UserError(f"{flag} {path}: {where} (read-only); choose another {flag}")


def kind_of(path: Path) -> Kind | None:
    for kind in KINDS:
        if kind.recognise(Path(path)):
            return kind
    return None


def check_replaceable(flag: str, path: Path | None, kind: Kind) -> None:
    """A directory the command will replace or fill: missing, empty (but for our own dead writers'
    leftovers), or of `kind` by its own records (never another kind, never the user's folder)."""
    if path is None:
        return
    check_output_dir(flag, path)
    resolved = resolved_output(flag, path)
    if not resolved.is_dir():
        return
    entries = sorted(p.name for p in resolved.iterdir() if not _dead_leftover(p))
    if not entries:
        return
    _refuse_while_written(flag, resolved, kind.made_by)  # a live writer's .partial-PID/ is not the user's file
    found = kind_of(resolved)
    if found is kind:
        if kind is EXPORT:
            check_writable(flag, path, resolved, replaced=True)
            _check_export_entries(flag, path, resolved)
        elif kind is DATA:
            _check_prepared_entries(flag, path, resolved)
        elif kind is REPORT:
            _check_report_entries(flag, path, resolved)
        return
    what = f"is {_a(found.name)} ({found.made_by})" if found else f"holds {_listing(resolved, entries)}"
    wanted = "a previous export" if kind is EXPORT else _a(kind.name)
    raise UserError(f"{flag} {path}: not empty and not {wanted}; "
                    f"it {what}: choose a new or empty directory")


def _a(name: str) -> str:
    return name if name == "prepared data" else f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _check_export_entries(flag: str, path: Path, resolved: Path) -> None:
    """Replacing an earlier export deletes all of it: refused while it holds anything it did not write
    (dotfiles and nested folders included) or a file changed since (export_info.json's sha256 per file)."""
    recorded = export_record(resolved).get("sha256")
    foreign = (_foreign_entries(resolved, {**recorded, "export_info.json": None}) if isinstance(recorded, dict)
               else _not_exported_before(resolved))
    if foreign:
        raise UserError(f"{flag} {path}: the earlier export there also holds {_listing(resolved, foreign)}, which "
                        f"replacing it would delete: move them out, or export to another directory")


def _refuse_while_written(flag: str, resolved: Path, command: str) -> None:
    """The writer lock of `resolved` held: another command writes it now (said before its files are listed)."""
    lock_path = resolved.parent / f".{resolved.name}.lock"
    if lock_path.is_file() and _read_small(lock_path) != str(os.getpid()) and _lock_held(lock_path):  # not ours
        raise UserError(f"{flag} {resolved}: another {command} (pid {_read_small(lock_path) or '?'}) is writing it "
                        f"now; wait for it or choose another {flag}")


def _check_report_entries(flag: str, path: Path, resolved: Path) -> None:
    """An earlier report is rewritten only while it holds nothing but what the report wrote, unchanged
    (launcher/outputs/written.py): a hand-edited report.md is named."""
    from launcher.outputs.written import DIR_RECORD, recorded_changes

    changes = recorded_changes(resolved, REPORT.name)
    if changes is None:
        changes = [f"report.md (no {DIR_RECORD}: not known to be unchanged since it was written)"]
    if changes:
        raise UserError(f"{flag} {path}: the earlier report there also holds {_listing(resolved, changes)}, which "
                        f"rewriting it would lose: move them out, or write the report to another directory")


def _check_prepared_entries(flag: str, path: Path, resolved: Path) -> None:
    """`data prepare --overwrite` replaces tokenizer/, train/ and valid/ whole: refused while they hold
    anything the prepare did not write (the manifest's shards, the tokenizer's files)."""
    from data_pipeline.tokenizer import tokenizer_files  # imports numpy: not at `--help` time

    splits = read_json_object(resolved / MANIFEST).get("splits")
    owned = {f"{split}/{shard.get('name')}{ext}": None for split, record in (splits or {}).items()
             if isinstance(record, dict) for shard in record.get("shards") or [] if isinstance(shard, dict)
             for ext in (".bin", ".idx")}
    try:
        owned.update({f"tokenizer/{name}": None for name in tokenizer_files(resolved / "tokenizer")})
    except DataError:
        pass  # an incomplete tokenizer folder: what is in it is listed below
    foreign = _foreign_entries(resolved, owned, under=("tokenizer", *SPLITS))
    if foreign:
        raise UserError(f"{flag} {path}: the prepared data there also holds {_listing(resolved, foreign)}, which "
                        f"--overwrite would delete: move them out, or prepare into another directory")


def _foreign_entries(root: Path, owned: dict, under: tuple[str, ...] | None = None) -> list[str]:
    """What below `root` (only below the folders `under`, when given) is not a file we wrote there:
    other files, links, folders, dotfiles; and files whose sha256 differs from the one `owned` records
    for them (None: not recorded)."""
    folders = {parent.as_posix() for name in owned for parent in Path(name).parents} - {"."}
    foreign = []
    for here, dirs, files in os.walk(root):
        relative_here = Path(here).relative_to(root)
        if under is not None and relative_here == Path("."):
            dirs[:] = [d for d in dirs if d in under and not (root / d).is_symlink()]
            foreign += [d for d in under if (root / d).is_symlink()]
            continue
        for name in sorted(dirs):
            relative = (relative_here / name).as_posix()
            if relative not in folders or (Path(here) / name).is_symlink():
                foreign.append(relative)
        dirs[:] = [d for d in dirs if (relative_here / d).as_posix() in folders and not (Path(here) / d).is_symlink()]
        for name in sorted(files):
            file, relative = Path(here) / name, (relative_here / name).as_posix()
            if relative not in owned or file.is_symlink():
                foreign.append(relative)
            elif owned[relative] is not None and file_sha256(file) != owned[relative]:
                foreign.append(f"{relative} (changed since the export)")
    return sorted(foreign)


def _not_exported_before(root: Path) -> list[str]:
    """An export written before export_info.json recorded its files: what is not among its known names,
    dotfiles included."""
    return [name for name in sorted(p.name for p in root.iterdir()) if name not in EXPORT_ENTRIES
            and not (name.startswith("model-") and name.endswith(".safetensors"))]  # weight shards


def _listing(path: Path, names: Iterable[str], limit: int = 3) -> str:
    names = list(names)
    shown = [f"{name}/" if (path / name).is_dir() else name for name in names[:limit]]
    return ", ".join(shown) + (f" and {len(names) - limit} more" if len(names) > limit else "")


_LEFTOVER = re.compile(r"^\.(?:partial-(\d+)|.+\.tmp-(\d+)-.*|.+\.lock)$")


def _dead_leftover(path: Path) -> bool:
    """A file our own writers leave while they work (`.partial-PID/` of data prepare, `.NAME.tmp-PID-*`
    of export, `.NAME.lock` of writer_lock), of a writer no longer running: ours to delete, not the user's."""
    match = _LEFTOVER.match(path.name)
    if match is None:
        return False
    pid = match.group(1) or match.group(2)
    if pid is None:  # a lock file (its holder's pid in it): the holder's flock is the proof of life
        return path.is_file() and _read_small(path).isdigit() and not _lock_held(path)
    return not pid_alive(int(pid))


def remove_dead_leftovers(out: Path) -> None:
    """Under the writer lock of `out`: delete what killed writers left in and beside it."""
    for place, prefix in ((out, ".partial-"), (out.parent, f".{out.name}.tmp-")):
        if not place.is_dir():
            continue
        for stale in place.iterdir():
            if stale.name.startswith(prefix) and _dead_leftover(stale):
                shutil.rmtree(stale, ignore_errors=True)


@contextlib.contextmanager
def publishing(flag: str, out, kind: Kind, command: str) -> Iterator[Path]:
    """The one entry of a command that publishes a directory: refuse (one line, before any work) a target
    that is not missing, empty or of `kind`, or not writable; then hold its writer lock while the command
    writes, with a dead writer's leftovers cleaned. Yields the resolved path, where the command writes."""
    check_replaceable(flag, out, kind)
    resolved = resolved_output(flag, out)
    with writer_lock(flag, resolved, command):
        remove_dead_leftovers(resolved)
        yield resolved


def check_run_dir_target(flag: str, run_dir) -> None:
    """`pretrain --run-dir`: a local path, missing, empty or a run directory (resumed): never a folder of
    the user's files nor prepared data, which the run's records would be mixed into."""
    refuse_url(flag, run_dir)
    check_replaceable(flag, run_dir, RUN)

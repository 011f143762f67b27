"""The one output gate (issue 63): every argument that names a path a command writes is declared with its kind,

    add_output(parser, "--out", EVAL_REPORT, default=None, help=...)

and launcher/cli.py passes every such argument of the chosen command through gate() before the command runs
(gate_parsed). The rule (docs/bad_inputs.md, "One output gate"): a new or empty path, or one of ours of the
same kind, unchanged since we wrote it (launcher/outputs/written.py; an edited file is named, never
replaced); never inside a run directory, an export or prepared data unless that is the kind's home; `~`
expanded alike everywhere (the argparse type), an empty string refused. Relations to the command's inputs
stay with the command (output_paths.check_paths). tests/unit/test_output_gate.py walks every command's
parser: a path-writing argument that is not declared here fails it.
"""
from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass
from pathlib import Path

from launcher.common.errors import UserError
from launcher.common.local_paths import refuse_url
from launcher.outputs.output_paths import (DATA, EXPORT, REPORT, REPRODUCTION, RUN, RUN_RECORDS, Kind, _a, _listing,
                                           check_output_dir, check_output_file, check_paths, check_replaceable,
                                           check_run_dir_target, kind_of, resolved_output)
from launcher.outputs.written import record_path, recorded_changes

_URL_LIKE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/")
_ENCLOSING = (RUN, EXPORT, DATA)
"""Our folders nothing else is written into (unless it is the output kind's home): a run's records, an
export's files and prepared data are read back by their own rules."""


@dataclass(frozen=True)
class OutputKind:
    """What one path-writing argument writes, and so which rule of the gate it gets."""

    name: str
    """As the messages name it ("eval-mlm report")."""
    made_by: str
    """The command that writes it ("roformer eval-mlm")."""
    directory: bool
    """A folder (else a file)."""
    folder: Kind | None = None
    """A folder kind of output_paths replaced or filled by its own records (prepared data, export, run,
    report, reproduction); None: a plain file or folder known by its record (written.py)."""
    homes: tuple[Kind, ...] = ()
    """Our folders it may be written inside (an export in RUN/export)."""
    replaces: bool = True
    """False: an existing path is never replaced, even one of ours (--save-model)."""
    remote: bool = False
    """May be s3://BUCKET/PREFIX (prepared data)."""
    in_place: tuple[Kind, ...] = ()
    """Folders of these kinds may be the target itself (report --out RUN_DIR: the default spelled out);
    then only the files this kind writes there (`writes`) are checked."""
    writes: tuple[str, ...] = ()
    scratch: bool = False
    """A work folder of ours (marked by its record), whose contents change while it is used."""
    whole: bool = False
    """Replaced whole by a rename (an export): a mount point is written into only while empty."""
    beside_run_records: bool = False
    """May be a .json file at the top of a run directory that is none of the run's own records (scripts/demo.sh
    writes RUN_DIR/eval_mlm.json, which `roformer report` reads); anywhere else in a run, refused."""


EVAL_REPORT = OutputKind("eval-mlm report", "roformer eval-mlm", directory=False, beside_run_records=True)
FINETUNE_REPORT = OutputKind("fine-tune report", "roformer finetune", directory=False, beside_run_records=True)
PREDICTIONS = OutputKind("predictions file", "roformer finetune", directory=False)
MODEL = OutputKind("fine-tuned model", "roformer finetune", directory=True, replaces=False)
TOKENIZER = OutputKind("tokenizer", "roformer data tokenizer", directory=True)
PREPARED = OutputKind("prepared data", "roformer data prepare", directory=True, folder=DATA, remote=True)
EXPORTED = OutputKind("export", "roformer export", directory=True, folder=EXPORT, homes=(RUN,), whole=True)
RUN_DIR = OutputKind("run directory", "roformer pretrain", directory=True, folder=RUN)
RUN_REPORT = OutputKind("report", "roformer report", directory=True, folder=REPORT, homes=(RUN,), in_place=(RUN,),
                        writes=("report.md",))
CLAIMS_REPORT = OutputKind("report", "roformer reproduce", directory=True, folder=REPORT)
REPRODUCED = OutputKind("reproduction output", "roformer reproduce", directory=True, folder=REPRODUCTION)
GPU_CHECK_REPORT = OutputKind("gpu-check report", "roformer gpu-check", directory=False)
GPU_CHECK_WORK = OutputKind("gpu-check work folder", "roformer gpu-check", directory=True, scratch=True)
SUGGESTED_SCHEDULE = OutputKind("schedule file", "roformer plan --from-run", directory=False)
OUTPUT_KINDS = (EVAL_REPORT, FINETUNE_REPORT, PREDICTIONS, MODEL, TOKENIZER, PREPARED, EXPORTED, RUN_DIR, RUN_REPORT,
                CLAIMS_REPORT, REPRODUCED, GPU_CHECK_REPORT, GPU_CHECK_WORK, SUGGESTED_SCHEDULE)


def output_path(text: str) -> Path:
    """The argparse type of every local output: `~` expanded here, once; an empty string refused (it was
    taken as the current directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path; give a file or directory name")
    return Path(text).expanduser()


def output_location(text: str):
    """The type of an output that may be in object storage: s3://... kept as text, else output_path."""
    from data_pipeline.remote.url import is_remote

    return text if is_remote(text) else output_path(text)


def add_output(parser, flag: str, kind: OutputKind, **kwargs) -> argparse.Action:
    """Declare a path-writing argument: its type expands `~`, and gate_parsed checks it by `kind`."""
    action = parser.add_argument(flag, type=output_location if kind.remote else output_path, **kwargs)
    action.output_kind = kind
    return action


def _chosen_actions(parser: argparse.ArgumentParser, args: argparse.Namespace | None):
    """Every action of `parser` and, below a subcommand, of the chosen one (of every one when `args` is None)."""
    for action in parser._actions:  # noqa: SLF001 - argparse keeps its actions only there
        yield action
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            chosen = getattr(args, action.dest, None) if args is not None else None
            for name, subparser in action.choices.items():
                if args is None or name == chosen:
                    yield from _chosen_actions(subparser, args)


def output_actions(parser: argparse.ArgumentParser, args: argparse.Namespace | None = None):
    """(action, kind) of every declared output of `parser` (below a subcommand: the chosen one's)."""
    for action in _chosen_actions(parser, args):
        if getattr(action, "output_kind", None) is not None:
            yield action, action.output_kind


def _flag(action: argparse.Action) -> str:
    return action.option_strings[0] if action.option_strings else action.metavar or action.dest.upper()


def _input_paths(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    """The command's path arguments that are read (type Path, and --input's files): flag -> value(s)."""
    found = {}
    for action in _chosen_actions(parser, args):
        value = getattr(args, action.dest, None)
        if getattr(action, "output_kind", None) is not None or value in (None, [], ""):
            continue
        values = value if isinstance(value, list) else [value]
        if action.type is Path or (action.dest == "input" and all(isinstance(v, str) for v in values)):
            found[_flag(action)] = [v for v in values if not _URL_LIKE.match(str(v))]
    return found


def gate_parsed(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[tuple[str, object]]:
    """The one place each command's outputs are checked, before the command runs: every output argument it
    was given against its inputs and its other outputs (check_paths), then by its kind (gate). Returns
    (flag, value) of each."""
    outputs = [(_flag(action), getattr(args, action.dest, None), kind) for action, kind in output_actions(parser, args)]
    outputs = [(flag, value, kind) for flag, value, kind in outputs if value is not None]
    inputs = _input_paths(parser, args)
    for flag, value, kind in outputs:
        if kind.remote and _URL_LIKE.match(str(value)):
            continue
        refuse_url(flag, value)
        resolved = resolved_output(flag, value)
        mine = {}  # inputs that are the kind's home may hold it (RUN_DIR/export); in_place: may be it (report)
        for other, values in inputs.items():
            for each in values:
                where = Path(each).expanduser().resolve()
                home = where.is_dir() and kind_of(where) in (*kind.homes, *kind.in_place)
                if home and (where != resolved or kind.in_place):
                    mine.setdefault(other, []).append(each)
        check_paths({k: [v for v in vs if v not in mine.get(k, [])] for k, vs in inputs.items()}, {flag: value})
        check_paths({k: v for k, v in mine.items()}, {flag: value} if not kind.in_place else {}, may_hold=tuple(mine))
    check_paths({}, {flag: value for flag, value, kind in outputs if not (kind.remote and _URL_LIKE.match(str(value)))})
    for flag, value, kind in outputs:
        gate(flag, value, kind)
    return [(flag, value) for flag, value, _ in outputs]


def gate(flag: str, value, kind: OutputKind) -> None:
    """Refuse, in one line naming `flag`, a path `kind` may not write (module docstring)."""
    if value is None:
        return
    if kind.remote and isinstance(value, str):
        from data_pipeline.remote.url import is_remote

        if is_remote(value):
            return
    refuse_url(flag, value)
    shown = f"{flag} {value}"
    resolved = resolved_output(flag, value)
    _refuse_inside_ours(shown, resolved, kind)
    if kind.folder is RUN:
        check_run_dir_target(flag, value)
    elif kind.in_place and resolved.is_dir() and kind_of(resolved) in kind.in_place:
        check_output_dir(flag, value)
        for name in kind.writes:
            _check_own_file(f"{shown}: {name}", resolved / name, kind)
    elif kind.folder is not None:
        check_replaceable(flag, value, kind.folder)
        if kind.whole and os.path.ismount(resolved) and any(resolved.iterdir()):
            raise UserError(f"{shown}: a mount point holding {_a(kind.name)}, which is replaced whole by a rename and "
                            f"a mount point cannot be: empty it, or choose a folder inside it")
    elif kind.directory:
        _check_own_folder(flag, value, resolved, kind, shown)
    else:
        check_output_file(flag, value)
        _check_own_file(shown, resolved, kind)


_RUN_TOP_RECORDS = {record.split("/")[0] for record in RUN_RECORDS} | {
    "config.yaml", "metrics.jsonl", "report.md", "hostfile", "config_versions.json", "restarts.json"}
"""What a run writes at its top (launcher/run_dir/layout.py), present or not yet."""


def _refuse_inside_ours(shown: str, resolved: Path, kind: OutputKind) -> None:
    for parent in resolved.parents:
        found = next((k for k in _ENCLOSING if k.recognise(parent)), None)
        beside_records = (found is RUN and kind.beside_run_records and parent == resolved.parent
                          and resolved.suffix == ".json" and resolved.name not in _RUN_TOP_RECORDS)
        if found is not None and found not in kind.homes and not beside_records:
            raise UserError(f"{shown}: is inside {_a(found.name)} ({found.made_by}), {parent}; writing there would "
                            f"mix {_a(kind.name)} into it: choose a path outside it")


def _check_own_file(shown: str, path: Path, kind: OutputKind) -> None:
    """An existing file is replaced only when our record of `kind` proves it unchanged since we wrote it."""
    if not path.exists():
        return
    if path.is_file() and kind.replaces:
        changes = recorded_changes(path, kind.name)
        if changes == []:
            return
        if changes:
            raise UserError(f"{shown}: changed since {kind.made_by} wrote it; replacing it would lose the edit: "
                            f"move it away or choose a new file name")
    raise UserError(f"{shown}: exists, and is not {_a(kind.name)} {kind.made_by} wrote (no record of it in "
                    f"{record_path(path).name}); it is never replaced: move it away or choose a new file name")


def _check_own_folder(flag: str, value, resolved: Path, kind: OutputKind, shown: str) -> None:
    """A plain output folder: missing or empty, or (`replaces`) ours of `kind` by its record, unchanged
    (a scratch folder: marked as ours)."""
    check_output_dir(flag, value)
    if not resolved.is_dir() or not any(resolved.iterdir()):
        return
    if kind.replaces:
        if kind.scratch and _marked(resolved, kind):
            return
        changes = None if kind.scratch else recorded_changes(resolved, kind.name)
        if changes == []:
            return
        if changes:
            raise UserError(f"{shown}: the earlier {kind.name} there also holds {_listing(resolved, changes)}, which "
                            f"replacing it would lose: move them out, or choose a new or empty directory")
    found = kind_of(resolved)
    holds = (f"it is {_a(found.name)} ({found.made_by})" if found
             else f"it holds {_listing(resolved, sorted(p.name for p in resolved.iterdir()))}")
    ours = "" if not kind.replaces else f" and not {_a(kind.name)} {kind.made_by} wrote"
    raise UserError(f"{shown}: not empty{ours}; {holds}: choose a new or empty directory")


def _marked(folder: Path, kind: OutputKind) -> bool:
    from launcher.common.io import read_json_object

    return read_json_object(record_path(folder)).get("kind") == kind.name

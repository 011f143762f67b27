"""Hostfiles (`HOST slots=N` per line) and the `--include/--exclude/--num_nodes/--num_gpus` filters.

A hostfile is validated before anything starts, because its names reach command lines (ssh, pdsh, the
pre-flight checks): a name is letters, digits, '-', '.', '_' and never starts with '-', so `node1;rm -rf ~`
is refused with its file and line. The filters keep DeepSpeed's syntax and are resolved by DeepSpeed's own
functions once every name and slot is checked, so the message names the bad one.
"""
from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from launcher.common.errors import UserError

# RFC 1123 labels (plus '_', which real clusters use), dot separated; IPv4 addresses match too.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9])?"
HOSTNAME_RE = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
MAX_HOSTNAME_LENGTH = 253
LOCAL_HOSTNAMES = frozenset({"localhost", "127.0.0.1"})
ALLOWED_KEYS = ("slots",)


@dataclass(frozen=True)
class HostEntry:
    """One host of a hostfile."""

    name: str  # host name as written; resolved by ssh (and pdsh) on the launching machine
    slots: int  # ranks to start on it (GPUs; CPU ranks on a CPU machine), >= 1
    line: int  # 1-based line number in the hostfile, for messages


@dataclass(frozen=True)
class Hostfile:
    """A validated hostfile: hosts in file order (that order fixes the global rank numbering)."""

    path: str  # where it was read from, for messages
    hosts: tuple[HostEntry, ...]  # at least one, names unique

    @property
    def slots_by_host(self) -> "OrderedDict[str, int]":
        return OrderedDict((h.name, h.slots) for h in self.hosts)

    def entry(self, name: str) -> HostEntry:
        return next(h for h in self.hosts if h.name == name)

    def render(self) -> str:
        """Canonical text (what DeepSpeed's runner and mpirun are given): no comments, one host a line."""
        return "".join(f"{h.name} slots={h.slots}\n" for h in self.hosts)


def check_hostname(name: str, where: str) -> str:
    """Return `name` if it is a plain host name, else raise UserError naming `where`."""
    if not name:
        raise UserError(f"{where}: empty host name")
    if len(name) > MAX_HOSTNAME_LENGTH or not HOSTNAME_RE.fullmatch(name):
        raise UserError(
            f"{where}: {name!r} is not a valid host name (allowed: letters, digits, '-', '.', '_'; "
            "must start and end with a letter or digit)"
        )
    return name


def parse_hostfile_text(text: str, path: str = "<hostfile>") -> Hostfile:
    """Parse hostfile text. Each failure names `path:line` and what is wrong."""
    hosts: list[HostEntry] = []
    first_line_of: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        content = raw.split("#", 1)[0].strip()
        if not content:
            continue  # blank line or comment
        where = f"{path}:{number}"
        name, *fields = content.split()
        check_hostname(name, where)
        if name in first_line_of:
            raise UserError(f"{where}: duplicate host {name!r} (first listed on line {first_line_of[name]})")
        slots = _parse_fields(fields, where)
        first_line_of[name] = number
        hosts.append(HostEntry(name=name, slots=slots, line=number))
    if not hosts:
        raise UserError(f"{path}: no hosts (expected lines like 'node1 slots=4')")
    return Hostfile(path=path, hosts=tuple(hosts))


def _parse_fields(fields: list[str], where: str) -> int:
    """The `key=value` fields after the host name; only `slots` is known and it is required."""
    values: dict[str, str] = {}
    for field in fields:
        key, sep, value = field.partition("=")
        if not sep:
            raise UserError(f"{where}: expected key=value after the host name, got {field!r}")
        if key not in ALLOWED_KEYS:
            raise UserError(f"{where}: unknown key {key!r} (allowed: {', '.join(ALLOWED_KEYS)})")
        if key in values:
            raise UserError(f"{where}: {key} given twice")
        values[key] = value
    if "slots" not in values:
        raise UserError(f"{where}: missing slots=N")
    text = values["slots"]
    if not re.fullmatch(r"[+-]?\d+", text):
        raise UserError(f"{where}: slots must be a whole number, got {text!r}")
    slots = int(text)
    if slots < 1:
        raise UserError(f"{where}: slots must be >= 1, got {slots}")
    return slots


def read_hostfile(path: str | Path) -> Hostfile:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"--hostfile: {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"--hostfile: cannot read {path}: {err}") from None
    return parse_hostfile_text(text, str(path))


def _check_filter(spec: str, flag: str, hostfile: Hostfile) -> None:
    """Every NAME in a DeepSpeed `NAME[:SLOT,...]@...` filter is a hostfile host; every SLOT exists."""
    slots_by_host = hostfile.slots_by_host
    for node_spec in spec.split("@"):
        name, sep, slot_text = node_spec.partition(":")
        check_hostname(name, flag)
        if name not in slots_by_host:
            raise UserError(
                f"{flag}: host {name!r} is not in {hostfile.path} (hosts: {', '.join(slots_by_host)})"
            )
        if not sep:
            continue
        for slot in slot_text.split(","):
            if not slot.isdigit():
                raise UserError(f"{flag}: slot {slot!r} on host {name!r} is not a whole number")
            if int(slot) >= slots_by_host[name]:
                raise UserError(
                    f"{flag}: host {name!r} has slots 0..{slots_by_host[name] - 1} in {hostfile.path}, "
                    f"not {int(slot)}"
                )


def resolve_resources(
    hostfile: Hostfile | None,
    *,
    include: str = "",
    exclude: str = "",
    num_nodes: int = -1,
    num_gpus: int = -1,
    local_slots: int = 1,
) -> "OrderedDict[str, list[int]]":
    """The slots each host contributes, in rank order, exactly as DeepSpeed's runner will resolve them.

    Without a hostfile the job is local: `localhost` with `num_gpus` slots (else `local_slots`,
    the accelerator's device count).
    """
    if (include or exclude) and (num_nodes >= 0 or num_gpus >= 0):
        raise UserError("--num_nodes/--num_gpus cannot be combined with --include/--exclude")
    if include and exclude:
        raise UserError("--include and --exclude are mutually exclusive")
    for flag, value in (("--num_gpus", num_gpus), ("--num_nodes", num_nodes)):
        if value == 0 or value < -1:  # -1 is DeepSpeed's "all of them"
            raise UserError(f"{flag} {value}: must be >= 1 when given (-1: all of them)")
    if hostfile is None:
        if include or exclude:
            raise UserError("--include/--exclude need a --hostfile")
        if num_nodes > 1:
            raise UserError(f"--num_nodes {num_nodes} needs a --hostfile listing that many hosts")
        return OrderedDict(localhost=list(range(num_gpus if num_gpus > 0 else local_slots)))

    if include:
        _check_filter(include, "--include", hostfile)
    if exclude:
        _check_filter(exclude, "--exclude", hostfile)
    if num_nodes > len(hostfile.hosts):
        raise UserError(f"--num_nodes {num_nodes}: {hostfile.path} lists only {len(hostfile.hosts)} host(s)")

    from deepspeed.launcher.runner import apply_num_nodes_and_gpus, parse_inclusion_exclusion

    try:
        active = parse_inclusion_exclusion(hostfile.slots_by_host, include, exclude)
    except ValueError as err:  # our checks above should have caught it; keep DeepSpeed's words
        raise UserError(f"--include/--exclude: {err}") from None
    active = apply_num_nodes_and_gpus(active, num_nodes, -1)
    if num_gpus > 0:
        # DeepSpeed would start num_gpus ranks on every host even beyond its slots; refuse instead.
        for name in active:
            entry = hostfile.entry(name)
            if num_gpus > entry.slots:
                raise UserError(
                    f"--num_gpus {num_gpus}: host {name!r} has slots={entry.slots} "
                    f"({hostfile.path}:{entry.line})"
                )
    active = apply_num_nodes_and_gpus(active, -1, num_gpus)
    if not active:
        raise UserError(f"--exclude {exclude!r} leaves no host of {hostfile.path} to run on")
    return OrderedDict(active)


def world_size_of(resources: "OrderedDict[str, list[int]]") -> int:
    return sum(len(slots) for slots in resources.values())


def is_local_only(resources: "OrderedDict[str, list[int]]") -> bool:
    return all(name in LOCAL_HOSTNAMES for name in resources)

"""The named sources of one prepared dataset (`roformer data prepare --source NAME=PATH,...`): their
files, the check that each gives the train split documents, and their manifest entries.

data_pipeline/prepare.py drives the passes; this module only knows sources, files and counts.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from data_pipeline.config import SourceSpec
from data_pipeline.errors import DataError
from data_pipeline.inputs import resolve_inputs
from data_pipeline.manifest import SPLITS


def resolve_sources(specs: list[SourceSpec]) -> list[list[Path]]:
    """Each source's files (resolve_inputs); a file named by two sources is refused."""
    owner: dict[Path, str] = {}
    resolved = []
    for spec in specs:
        files = resolve_inputs(spec.inputs)
        for path in files:
            other = owner.setdefault(path.resolve(), spec.name)
            if other != spec.name:
                raise DataError(f"{path}: named by both source {other!r} and source {spec.name!r} "
                                f"(a file belongs to one source)")
        resolved.append(files)
    return resolved


def check_sources(specs: list[SourceSpec], files: list[tuple]) -> None:
    """Every source must give the train split documents, or a stage could never draw from it.

    files: per scanned file (source index, documents read, kept for train, dropped, and, from --lenient, the
    skipped lines by reason (a Counter) and examples 'file:line: reason')."""
    for index, spec in enumerate(specs):
        mine = [f for f in files if f[0] == index]
        if not sum(f[2] for f in mine):
            raise DataError(f"--source {spec.name} ({', '.join(spec.inputs)}): no documents for the train split "
                            f"({sum(f[1] for f in mine)} read, {sum(f[3] for f in mine)} dropped as duplicates "
                            f"or over the cap{_lenient_skips(mine)})")


def _lenient_skips(files: list[tuple]) -> str:
    """What --lenient skipped in `files`, for the line above: '0 read' alone hides that every line was
    skipped (a Latin-1 file is invalid UTF-8 line by line)."""
    reasons = Counter()
    for f in files:
        reasons.update({k: v for k, v in f[4].items() if k != "empty file"})
    if not reasons:
        return ""
    example = next((e for f in files for e in f[5] if not e.endswith(": empty file")), "")
    hint = "; input is read as UTF-8: convert the file, e.g. `iconv -f latin1 -t utf-8`" \
        if "invalid UTF-8" in reasons else ""
    return (f"; --lenient skipped {sum(reasons.values())} line(s): "
            + ", ".join(f"{n} {reason}" for reason, n in reasons.most_common())
            + (f", e.g. {example}" if example else "") + hint)


def source_entries(specs: list[SourceSpec], files: list[tuple[int, Path, int]], splits: dict) -> list[dict]:
    """The manifest's `sources`: per source its files, and its documents and tokens per split.

    files: per scanned file (source index, path, documents read); splits: the manifest's, whose
    shard entries name their source."""
    entries = []
    for index, spec in enumerate(specs):
        counts = {}
        for split in SPLITS:
            shards = [e for e in splits[split]["shards"] if e["source"] == spec.name]
            counts[split] = {"documents": sum(e["documents"] for e in shards),
                             "tokens": sum(e["tokens"] for e in shards)}
        listed = [{"path": str(path), "bytes": path.stat().st_size, "documents": documents}
                  for source, path, documents in files if source == index]
        entries.append({"name": spec.name, "files": listed, **counts})
    return entries

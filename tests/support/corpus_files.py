"""Shared builders for the data tests (no tests here): small real corpora and prepared directories.

Text is real: English from Debian's linux-doc (Documentation/process), Chinese from its zh_CN
translations, both installed by scripts/setup.sh. Prepared directories are cached per pytest
process, so the several test modules share one SentencePiece training.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

from data_pipeline.config import (
    CleaningConfig,
    InputConfig,
    PrepareConfig,
    TokenizerConfig,
)
from data_pipeline.prepare import prepare

DOC_ROOT = Path("/usr/share/doc/linux-doc-6.1/Documentation")
_CACHE: dict[str, Path] = {}

# Tiny but real: vocab <= 1000 and a coverage that lets Chinese characters fall back to [UNK] rarely.
TEST_TOKENIZER = TokenizerConfig(vocab_size=900, model_type="bpe", character_coverage=0.98)


def english_paragraphs(limit_files: int = 12) -> list[str]:
    """Blank-line-separated paragraphs of real English reStructuredText."""
    files = sorted((DOC_ROOT / "process").glob("*.rst.gz"))[:limit_files]
    paragraphs = []
    for f in files:
        text = gzip.decompress(f.read_bytes()).decode("utf-8")
        paragraphs.extend(p.strip() for p in text.split("\n\n") if len(p.strip()) > 40)
    return paragraphs


def chinese_paragraphs(limit_files: int = 12) -> list[str]:
    files = sorted((DOC_ROOT / "translations" / "zh_CN" / "process").glob("*.rst.gz"))[:limit_files]
    paragraphs = []
    for f in files:
        text = gzip.decompress(f.read_bytes()).decode("utf-8")
        paragraphs.extend(p.strip() for p in text.split("\n\n")
                          if len(p.strip()) > 20 and any("\u4e00" <= c <= "\u9fff" for c in p))
    return paragraphs


def write_jsonl(path: Path, texts: list[str], field: str = "text") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({field: t, "meta": len(t)}, ensure_ascii=False) + "\n")
    return path


def raw_corpus(root: Path) -> list[Path]:
    """Uneven input files: three English JSONL parts of different sizes, one Chinese, one .txt."""
    if "raw" in _CACHE:
        return sorted(_CACHE["raw"].glob("*"))
    en, zh = english_paragraphs(), chinese_paragraphs()
    root.mkdir(parents=True, exist_ok=True)
    cut1, cut2 = len(en) // 6, len(en) // 2
    write_jsonl(root / "a_en.jsonl", en[:cut1])
    write_jsonl(root / "b_en.jsonl", en[cut1:cut2] + en[:5])  # five exact duplicates of file a
    write_jsonl(root / "c_zh.jsonl", zh)
    (root / "d_en.txt").write_text("\n".join(p.replace("\n", " ") for p in en[cut2:]) + "\n", encoding="utf-8")
    _CACHE["raw"] = root
    return sorted(root.glob("*"))


def prepared_dir(tmp_factory, name: str = "main", **overrides) -> Path:
    """A prepared data dir over `raw_corpus`, built once per pytest process per name."""
    if name in _CACHE:
        return _CACHE[name]
    raw = raw_corpus(tmp_factory.mktemp("raw"))
    out = tmp_factory.mktemp(f"prepared_{name}")
    options = dict(shard_tokens=6000, workers=1,
                   cleaning=CleaningConfig(valid_fraction=0.05))
    options.update(overrides)
    cfg = PrepareConfig(input=InputConfig(inputs=[str(p) for p in raw]), out_dir=out,
                        tokenizer=TEST_TOKENIZER, **options)
    prepare(cfg, log=lambda msg: None)
    _CACHE[name] = out
    return out


def named_sources_dir(tmp_factory) -> Path:
    """`raw_corpus` prepared as two named sources, `en` (the three English files) and `zh` (the Chinese
    one), with `prepared_dir`'s tokenizer (vocab 900, as the tiny model configs): the data of a stage
    `mixture`. Built once per pytest process."""
    from data_pipeline.config import SourceSpec

    if "named_sources" in _CACHE:
        return _CACHE["named_sources"]
    tokenizer = prepared_dir(tmp_factory)
    raw = raw_corpus(tmp_factory.mktemp("raw"))
    out = tmp_factory.mktemp("prepared_named_sources")
    sources = [SourceSpec("en", [str(p) for p in raw if "_en" in p.name]),
               SourceSpec("zh", [str(p) for p in raw if "_zh" in p.name])]
    cfg = PrepareConfig(input=InputConfig(sources=sources), out_dir=out, existing_tokenizer=tokenizer,
                        shard_tokens=6000, cleaning=CleaningConfig(valid_fraction=0.05))
    prepare(cfg, log=lambda msg: None)
    _CACHE["named_sources"] = out
    return out

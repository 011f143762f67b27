"""Corpus preparation: manifest, de-duplication, hash split, workers, formats, caps, sources."""
from __future__ import annotations

import gzip
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_pipeline import DataError, open_corpus, sources
from data_pipeline.config import CleaningConfig, InputConfig, PrepareConfig
from data_pipeline.prepare import prepare
from data_pipeline.manifest import file_sha256
from tests.support.corpus_files import (
    TEST_TOKENIZER,
    english_paragraphs,
    prepared_dir,
    raw_corpus,
    write_jsonl,
)


def documents(data_dir, split) -> list[tuple[int, ...]]:
    corpus = open_corpus(data_dir, split)
    docs = []
    for shard in corpus.shards:
        ids, offsets = np.asarray(shard.token_ids), np.asarray(shard.offsets)
        docs.extend(tuple(ids[a:b].tolist()) for a, b in zip(offsets[:-1], offsets[1:]))
    return docs


def prepare_into(out, inputs, workers=1, existing_tokenizer=None, **cleaning):
    cfg = PrepareConfig(input=InputConfig(inputs=[str(p) for p in inputs]), out_dir=out,
                        tokenizer=TEST_TOKENIZER, workers=workers, shard_tokens=6000,
                        existing_tokenizer=existing_tokenizer,
                        cleaning=CleaningConfig(valid_fraction=0.05, **cleaning))
    return prepare(cfg, log=lambda msg: None)


def test_manifest_describes_the_shards(tmp_path_factory):
    data_dir = prepared_dir(tmp_path_factory)
    manifest = json.loads((data_dir / "manifest.json").read_text())
    assert manifest["dtype"] == "uint16" and manifest["tokenizer"]["vocab_size"] == 900
    assert [s["name"] for s in manifest["sources"]] == ["default"]  # plain inputs: one source
    assert len(manifest["sources"][0]["files"]) == 4
    stats = manifest["stats"]
    assert stats["duplicates_removed"] >= 5  # the five copied paragraphs, plus real repeats
    assert stats["train_documents"] + stats["valid_documents"] == stats["documents_read"] - stats["duplicates_removed"]
    for split in ("train", "valid"):
        entries = manifest["splits"][split]["shards"]
        assert sum(e["tokens"] for e in entries) == manifest["splits"][split]["tokens"] == stats[f"{split}_tokens"]
        for e in entries:
            assert file_sha256(data_dir / split / f"{e['name']}.bin") == e["bin_sha256"]
    train, valid = documents(data_dir, "train"), documents(data_dir, "valid")
    assert len(train) == len(set(train))  # exact duplicates removed
    assert not set(train) & set(valid)  # no document on both sides
    assert 0.02 < len(valid) / (len(train) + len(valid)) < 0.09


def test_split_is_by_document_hash_and_workers_do_not_change_content(tmp_path_factory, tmp_path):
    data_dir = prepared_dir(tmp_path_factory)
    raw = raw_corpus(tmp_path_factory.mktemp("unused"))
    # Reversed input order, two worker processes, same tokenizer: every document keeps its split.
    other = tmp_path / "reversed"
    prepare_into(other, raw[::-1], workers=2, existing_tokenizer=data_dir)
    assert set(documents(other, "valid")) == set(documents(data_dir, "valid"))
    assert set(documents(other, "train")) == set(documents(data_dir, "train"))
    assert documents(other, "train") != documents(data_dir, "train")  # order did change


def test_formats_txt_paragraphs_gzip_and_parquet(tmp_path, tmp_path_factory):
    data_dir = prepared_dir(tmp_path_factory)
    paragraphs = english_paragraphs(6)
    txt = tmp_path / "in" / "blocks.txt.gz"
    txt.parent.mkdir()
    txt.write_bytes(gzip.compress("\n\n".join(paragraphs[:40]).encode()))
    table = pa.table({"body": paragraphs[40:80], "n": list(range(40))})
    pq.write_table(table, tmp_path / "in" / "rows.parquet")
    cfg = PrepareConfig(input=InputConfig(inputs=[str(tmp_path / "in")], txt_mode="paragraph", text_field="body"),
                        out_dir=tmp_path / "out", tokenizer=TEST_TOKENIZER, existing_tokenizer=data_dir,
                        cleaning=CleaningConfig(valid_fraction=0.0, dedup=False))
    report = prepare(cfg, log=lambda msg: None)
    assert report.stats["documents_read"] == 80  # 40 blank-line blocks + 40 parquet rows
    from data_pipeline import load_tokenizer
    sp = load_tokenizer(data_dir)
    assert set(documents(tmp_path / "out", "train")) == {tuple(sp.encode(p.strip())) for p in paragraphs[:80]}


def test_max_documents_caps_the_input_and_existing_output_is_protected(tmp_path, tmp_path_factory):
    raw = raw_corpus(tmp_path_factory.mktemp("unused"))
    out = tmp_path / "capped"
    report = prepare_into(out, raw, max_documents=100, dedup=False)
    assert report.stats["documents_read"] >= 100
    assert report.stats["train_documents"] + report.stats["valid_documents"] == 100
    with pytest.raises(DataError, match="already holds prepared data"):
        prepare_into(out, raw, max_documents=100)
    assert not list(out.glob(".partial-*"))


def test_normalization_and_control_characters(tmp_path, tmp_path_factory):
    data_dir = prepared_dir(tmp_path_factory)
    path = write_jsonl(tmp_path / "n.jsonl", ["ﬁne\x07 text\x00 here", "plain words"])
    cfg = PrepareConfig(input=InputConfig(inputs=[str(path)]), out_dir=tmp_path / "o",
                        tokenizer=TEST_TOKENIZER, existing_tokenizer=data_dir,
                        cleaning=CleaningConfig(valid_fraction=0.0, nfkc=True))
    prepare(cfg, log=lambda msg: None)
    from data_pipeline import load_tokenizer
    sp = load_tokenizer(data_dir)
    assert set(documents(tmp_path / "o", "train")) == {tuple(sp.encode("fine text here")),
                                                       tuple(sp.encode("plain words"))}


def test_sources_helpers(tmp_path, monkeypatch):
    assert sources.strip_pos_tags("迈向/v  充满/v  [中央/n  人民/n]nt  １２月/t") == "迈向充满中央人民１２月"
    english = sources.linux_doc_english_files()
    rel = [p.relative_to(sources.LINUX_DOC_ROOT).as_posix() for p in english]
    assert len(rel) > 2000 and not any(r.startswith("translations/") or "html/_sources" in r for r in rel)
    with pytest.raises(DataError, match="default corpus not installed"):
        sources.default_corpus_files(tmp_path)
    # Conversion of a small tree: translations skipped, one document per file, second run a no-op.
    fake = tmp_path / "Documentation"
    (fake / "a").mkdir(parents=True)
    (fake / "a" / "x.rst.gz").write_bytes(gzip.compress(b"Title\n=====\n\nSome text."))
    (fake / "translations" / "zh_CN").mkdir(parents=True)
    (fake / "translations" / "zh_CN" / "y.rst.gz").write_bytes(gzip.compress("中文".encode()))
    target = tmp_path / "corpora" / sources.ENGLISH_DIR
    sources._install_linux_doc(target, root=fake)
    records = [json.loads(line) for f in sorted(target.glob("*.jsonl")) for line in f.read_text().splitlines()]
    assert records == [{"text": "Title\n=====\n\nSome text.", "source": "a/x.rst.gz"}]
    stamp_time = (target / ".complete.json").stat().st_mtime_ns
    sources._install_linux_doc(target, root=fake)
    assert (target / ".complete.json").stat().st_mtime_ns == stamp_time


def test_default_corpus_option_uses_the_installed_files(tmp_path, tmp_path_factory):
    from launcher.cli import main as roformer

    data_dir = prepared_dir(tmp_path_factory)
    cache = tmp_path / "cache"
    for lang_dir, texts in ((sources.ENGLISH_DIR, english_paragraphs(3)), (sources.CHINESE_DIR, ["人民日报。"] * 3)):
        target = sources.corpus_dir(cache) / lang_dir
        write_jsonl(target / "part.jsonl", texts)
        (target / ".complete.json").write_text("{}")
    assert [p.parent.name for p in sources.default_corpus_files(cache)] == [sources.ENGLISH_DIR, sources.CHINESE_DIR]
    out = tmp_path / "out"
    assert roformer(["data", "prepare", "--default-corpus", "en", "--data-cache", str(cache), "--out", str(out),
                     "--tokenizer", str(data_dir), "--valid-fraction", "0"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert [(s["name"], [f["path"] for f in s["files"]]) for s in manifest["sources"]] == [
        ("en", [str(sources.corpus_dir(cache) / sources.ENGLISH_DIR / "part.jsonl")])]
    assert manifest["stats"]["train_documents"] == len(set(english_paragraphs(3)))


_PREPARE_PROBE = """
import json, runpy, sys
sys.argv = ["roformer", *sys.argv[1:]]
try:
    runpy.run_module("launcher", run_name="__main__", alter_sys=True)
except SystemExit as stop:
    assert stop.code in (0, None), stop.code
print(json.dumps({"torch imported": "torch" in sys.modules}))
"""


def test_data_prepare_reads_text_and_jsonl_without_importing_torch(tmp_path):
    """`roformer data prepare` never uses torch; `datasets` would import all of it (2+ CPU-s) for a DataLoader
    worker counter of its streaming datasets (data_pipeline/inputs.py keeps it from doing so)."""
    import subprocess
    import sys

    from tests.support.helpers import REPO, roformer_env

    paragraphs = english_paragraphs(4)
    write_jsonl(tmp_path / "a.jsonl", paragraphs[::2])
    (tmp_path / "b.txt").write_text("\n\n".join(paragraphs[1::2]), encoding="utf-8")
    proc = subprocess.run([sys.executable, "-c", _PREPARE_PROBE, "data", "prepare", "--input", str(tmp_path / "a.jsonl"),
                           str(tmp_path / "b.txt"), "--txt-mode", "paragraph", "--out", str(tmp_path / "out"),
                           "--vocab-size", "300"], cwd=REPO, env=roformer_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"torch imported": False}
    assert open_corpus(tmp_path / "out", "train").documents > 0

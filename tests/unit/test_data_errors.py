"""Every bad input of issue 6 section 7: a DataError naming the file (and line), or a counted skip."""
from __future__ import annotations

import gzip
import json
import shutil

import pytest

from data_pipeline import DataError, PretrainBatches, open_corpus, tokenizer_hash
from data_pipeline.config import CleaningConfig, InputConfig, PrepareConfig
from data_pipeline.prepare import prepare
from launcher.cli import main as roformer
from tests.support.corpus_files import (
    TEST_TOKENIZER,
    english_paragraphs,
    prepared_dir,
    write_jsonl,
)


def run_prepare(inputs, out, lenient=False, **input_kw):
    cfg = PrepareConfig(input=InputConfig(inputs=[str(p) for p in inputs], lenient=lenient, **input_kw),
                        out_dir=out, tokenizer=TEST_TOKENIZER, cleaning=CleaningConfig(valid_fraction=0.05))
    return prepare(cfg, log=lambda msg: None)


@pytest.fixture(scope="module")
def good_file(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("good") / "good.jsonl", english_paragraphs(20))


def with_bad_line(tmp_path, line_no: int, raw: bytes, name="bad.jsonl"):
    lines = [json.dumps({"text": t}).encode() for t in english_paragraphs(3)[:6]]
    lines.insert(line_no - 1, raw)
    path = tmp_path / name
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@pytest.mark.parametrize("raw, message", [
    (b'{"text": "unterminated', r"bad\.jsonl:3: malformed JSON"),
    (b'{"body": "no text field here"}', r"bad\.jsonl:3: missing text field 'text'"),
    (b'{"text": 42}', r"bad\.jsonl:3: text field 'text' is int"),
    ('{"text": "caf\u00e9"}'.encode("latin-1"), r"bad\.jsonl:3: invalid UTF-8"),
])
def test_bad_jsonl_line_names_file_and_line(tmp_path, good_file, raw, message):
    bad = with_bad_line(tmp_path, 3, raw)
    with pytest.raises(DataError, match=message):
        run_prepare([good_file, bad], tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_invalid_utf8_in_gzipped_text_file(tmp_path, good_file):
    bad = tmp_path / "bad.txt.gz"
    bad.write_bytes(gzip.compress(b"fine line\nanother fine line\nbroken \xff\xfe here\n"))
    with pytest.raises(DataError, match=r"bad\.txt\.gz:3: invalid UTF-8"):
        run_prepare([good_file, bad], tmp_path / "out")


def test_parquet_without_a_string_text_column(tmp_path, good_file):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["some text"]}), tmp_path / "a.parquet")
    with pytest.raises(DataError, match=r"a\.parquet: missing text field 'text'"):
        run_prepare([good_file, tmp_path / "a.parquet"], tmp_path / "out")
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "b.parquet")
    with pytest.raises(DataError, match=r"b\.parquet: text field 'text' has type int64"):
        run_prepare([good_file, tmp_path / "b.parquet"], tmp_path / "out")


def test_empty_file_missing_file_and_empty_glob(tmp_path, good_file):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(DataError, match=r"empty\.jsonl: empty file"):
        run_prepare([good_file, empty], tmp_path / "out")
    with pytest.raises(DataError, match=r"nope\.jsonl: no such file"):
        run_prepare([good_file, tmp_path / "nope.jsonl"], tmp_path / "out")
    with pytest.raises(DataError, match=r"\*\.parquet: glob matched no files"):
        run_prepare([good_file, str(tmp_path / "*.parquet")], tmp_path / "out")


def test_lenient_mode_counts_and_reports_skips(tmp_path, good_file):
    bad = with_bad_line(tmp_path, 2, b'{"text": "unterminated')
    lines = bad.read_bytes().split(b"\n")
    lines.insert(4, b'{"title": "no text"}')
    lines.insert(6, b'{"text": "caf\xe9"}')
    bad.write_bytes(b"\n".join(lines))
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    report = run_prepare([good_file, bad, empty], tmp_path / "out", lenient=True)
    stats = report.stats
    assert stats["skipped"] == {"malformed JSON": 1, "missing text field 'text'": 1, "invalid UTF-8": 1,
                                "empty file": 1}
    assert any("bad.jsonl:2: malformed JSON" in e for e in stats["skipped_examples"])
    assert "lenient mode skipped" in report.summary()
    good_docs = len([t for t in english_paragraphs(20)]) + 6  # the six good lines of bad.jsonl
    assert stats["documents_read"] == good_docs
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["stats"]["skipped"]["empty file"] == 1


@pytest.fixture()
def data_copy(tmp_path, tmp_path_factory):
    src = prepared_dir(tmp_path_factory)
    dst = tmp_path / "data"
    shutil.copytree(src, dst)
    return dst


def test_checksum_mismatch_names_the_shard(data_copy):
    shard = data_copy / "train" / "shard_00003.bin"
    raw = bytearray(shard.read_bytes())
    raw[10] ^= 0xFF
    shard.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=r"train/shard_00003\.bin: sha256 does not match"):
        open_corpus(data_copy, "train")
    open_corpus(data_copy, "train", verify=False)  # the size/structure checks still pass


def test_truncated_and_empty_shards_are_rejected(data_copy):
    shard = data_copy / "train" / "shard_00001.bin"
    shard.write_bytes(shard.read_bytes()[:-2])
    with pytest.raises(DataError, match=r"shard_00001\.bin: size .* does not match"):
        open_corpus(data_copy, "train", verify=False)
    manifest = json.loads((data_copy / "manifest.json").read_text())
    entry = manifest["splits"]["valid"]["shards"][0]
    entry["documents"], entry["tokens"] = 0, 0
    (data_copy / "valid" / f"{entry['name']}.bin").write_bytes(b"")
    (data_copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match=r"valid/shard_00000\.bin: empty shard"):
        open_corpus(data_copy, "valid")


def test_shards_from_another_tokenizer_are_rejected(data_copy, tmp_path):
    with pytest.raises(DataError, match="built with tokenizer .* the run uses"):
        open_corpus(data_copy, "train", expected_tokenizer_sha256="0" * 64)
    run_tokenizer = data_copy / "tokenizer" / "spm.model"
    assert open_corpus(data_copy, "train", expected_tokenizer_sha256=tokenizer_hash(run_tokenizer))
    # A tokenizer swapped in after preparation no longer matches the shards' manifest.
    other = tmp_path / "other"
    run_prepare([write_jsonl(tmp_path / "o.jsonl", english_paragraphs(4)[::-1])], other)
    shutil.copyfile(other / "tokenizer" / "spm.model", run_tokenizer)
    with pytest.raises(DataError, match=r"tokenizer/spm\.model: tokenizer sha256 .* does not match"):
        open_corpus(data_copy, "train")


def test_corpus_smaller_than_one_batch(tmp_path_factory):
    valid = open_corpus(prepared_dir(tmp_path_factory), "valid")
    reader = PretrainBatches(valid, world_size=2)
    with pytest.raises(DataError, match=r"valid: corpus has \d+ tokens .* fewer than one global batch"):
        reader.check_min_size(seq_len=512, global_batch=64)


def test_cli_prints_one_line_and_exits_2(tmp_path, good_file, capsys):
    bad = with_bad_line(tmp_path, 4, b"not json at all")
    code = roformer(["data", "prepare", "--input", str(good_file), str(bad), "--out", str(tmp_path / "o"),
                     "--vocab-size", "900"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].startswith("roformer data: error: ") and "bad.jsonl:4: malformed JSON" in err[-1]

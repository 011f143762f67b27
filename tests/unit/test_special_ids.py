"""Special tokens at any id (issue 31): BERT-style vocab.txt tokenizers (BertTokenizer, and RoFormerTokenizer
with jieba) prepared, packed and masked with the ids the tokenizer gives them; bad tokenizer directories
refused in one line before anything is written."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from data_pipeline import MaskingConfig, PretrainBatches, mask_tokens, open_corpus
from data_pipeline.config import CleaningConfig, InputConfig, PrepareConfig
from data_pipeline.errors import DataError
from data_pipeline.prepare import prepare
from data_pipeline.special_ids import DEFAULT, SpecialIds
from launcher.cli import main as cli_main
from tests.support.corpus_files import chinese_paragraphs, english_paragraphs, write_jsonl
from tests.support.hf_dirs import BERT_IDS, bert_english_tokenizer_dir, roformer_chinese_tokenizer_dir

BERT = SpecialIds(**BERT_IDS)


@pytest.fixture(scope="module")
def english(tmp_path_factory):
    """(texts, a BERT English tokenizer dir, the texts prepared with it)."""
    root = tmp_path_factory.mktemp("bert")
    texts = list(dict.fromkeys(english_paragraphs(4)))
    tokenizer = bert_english_tokenizer_dir(root / "bert", texts)
    corpus = write_jsonl(root / "corpus.jsonl", texts)
    prepare(PrepareConfig(input=InputConfig(inputs=[str(corpus)]), out_dir=root / "data", existing_tokenizer=tokenizer,
                          cleaning=CleaningConfig(valid_fraction=0.1)), log=lambda message: None)
    return texts, tokenizer, root / "data"


def _documents(data_dir: Path, splits=("train", "valid")) -> list[list[int]]:
    shards = [shard for split in splits for shard in open_corpus(data_dir, split).shards]
    return [shard.token_ids[shard.offsets[d]:shard.offsets[d + 1]].tolist()
            for shard in shards for d in range(shard.documents)]


def test_a_bert_vocab_txt_directory_gives_transformers_ids_for_every_document(english):
    from transformers import AutoTokenizer

    texts, tokenizer_dir, data_dir = english
    manifest = json.loads((data_dir / "manifest.json").read_text())
    assert manifest["special_ids"] == BERT_IDS
    assert manifest["special_tokens"] == {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}
    assert manifest["tokenizer"]["path"] == "tokenizer/vocab.txt" and manifest["tokenizer"]["model_type"] == "WordPiece"
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    assert type(tokenizer).__name__ == "BertTokenizer"
    assert sorted(_documents(data_dir)) == sorted(tokenizer(texts, add_special_tokens=False)["input_ids"])


def test_packing_uses_the_manifests_cls_sep_and_pad(english):
    """[CLS]=101 starts every sequence, [SEP]=102 closes every document, [PAD]=0 fills the tail (attention 0);
    the labels never point at a special id."""
    _, _, data_dir = english
    corpus = open_corpus(data_dir, "valid")
    batches = PretrainBatches(corpus, seed=1, masking=MaskingConfig(mask_prob=0.5), shuffle=False)
    batch = next(batches.iter_eval_batches(seq_len=48, micro_batch_size=64))
    ids, attention, labels = (batch[k].numpy() for k in ("input_ids", "attention_mask", "labels"))
    real = attention.sum(1) > 0
    assert (ids[real, 0] == 101).all() and (labels[real, 0] == -100).all()
    assert (ids[attention == 0] == 0).all() and (attention == 0).any()
    original = np.where(labels != -100, labels, ids)
    documents = sum(shard.documents for shard in corpus.shards)
    assert int((original == 102).sum()) == documents  # one [SEP] after each document of the split
    assert not BERT.is_special(labels[labels != -100]).any()


def test_masking_never_touches_the_special_ids():
    """Special ids at BERT's places inside the vocabulary: never chosen, never drawn as a replacement,
    and every ordinary id (also those below and between the special ones) can be drawn."""
    vocab = 130
    rng = np.random.default_rng(0)
    cfg = MaskingConfig(mask_prob=0.6, replace_with_mask=0.2, replace_with_random=0.8)
    drawn: set[int] = set()
    for seed in range(300):
        ids = rng.integers(0, vocab, size=64)
        ids[rng.random(64) < 0.3] = rng.choice(BERT.ids, size=1)  # plenty of special ids
        corrupted, labels = mask_tokens(ids, np.random.default_rng(seed), cfg, vocab, special=BERT)
        special = BERT.is_special(ids)
        assert (labels[special] == -100).all() and (corrupted[special] == ids[special]).all()
        changed = (labels != -100) & (corrupted != 103)
        assert not BERT.is_special(corrupted[changed]).any()
        drawn.update(corrupted[changed & (corrupted != ids)].tolist())
    assert drawn == set(range(vocab)) - set(BERT.ids.tolist())


def test_default_ids_mask_exactly_as_before():
    """Data prepared before special ids were recorded: ids 0-4, and the same masks as the fixed-id code
    (random replacements drawn with rng.integers(5, vocab))."""
    assert SpecialIds.from_manifest({}) == DEFAULT == SpecialIds(0, 1, 2, 3, 4)
    draws = DEFAULT.ordinary(900, 1000, np.random.default_rng(7))
    assert np.array_equal(draws, np.random.default_rng(7).integers(5, 900, size=1000))


def test_a_manifest_with_bad_special_ids_is_named():
    with pytest.raises(DataError, match="special_ids must map exactly"):
        SpecialIds.from_manifest({"special_ids": {"pad_token": 0}}, "m.json")
    with pytest.raises(DataError, match="m.json: special_ids: two special tokens share an id"):
        SpecialIds.from_manifest({"special_ids": {**BERT_IDS, "mask_token": 0}}, "m.json")


@pytest.fixture(scope="module")
def chinese_dir(tmp_path_factory):
    texts = list(dict.fromkeys(chinese_paragraphs(1)))
    out = tmp_path_factory.mktemp("zh") / "roformer"
    roformer_chinese_tokenizer_dir(out, texts)  # the tokenizer files of junnyu/roformer_chinese_base, small
    return texts, out


def _refused(capsys, tmp_path, tokenizer_dir, corpus) -> str:
    capsys.readouterr()
    argv = ["data", "prepare", "--input", str(corpus), "--out", str(tmp_path / "data"),
            "--tokenizer", str(tokenizer_dir)]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert not (tmp_path / "data").exists()
    return err[0]


def test_bad_tokenizer_directories_are_refused_in_one_line(capsys, tmp_path, chinese_dir, monkeypatch):
    texts, source = chinese_dir
    corpus = write_jsonl(tmp_path / "c.jsonl", texts)
    broken = tmp_path / "broken"
    shutil.copytree(source, broken)
    (broken / "tokenizer_config.json").unlink()
    assert "tokenizer files missing: tokenizer_config.json" in _refused(capsys, tmp_path, broken, corpus)
    shutil.copyfile(source / "tokenizer_config.json", broken / "tokenizer_config.json")
    (broken / "vocab.txt").unlink()
    assert "no tokenizer: none of spm.model, tokenizer.json, vocab.txt" in _refused(capsys, tmp_path, broken, corpus)
    lines = (source / "vocab.txt").read_text(encoding="utf-8").splitlines()
    (broken / "vocab.txt").write_text("\n".join(x for x in lines if x != "[MASK]") + "\n", encoding="utf-8")
    err = _refused(capsys, tmp_path, broken, corpus)
    assert "mask_token '[MASK]' is not in its vocabulary" in err
    monkeypatch.setitem(sys.modules, "rjieba", None)  # as if it were not installed
    err = _refused(capsys, tmp_path, source, corpus)
    assert "RoFormerTokenizer segments words with jieba, and the rjieba package is not installed" in err


def test_literal_special_tokens_in_a_document_stay_text(tmp_path, chinese_dir):
    """A document that contains "[MASK]" or "[CLS]" as text holds no special id (the tokenizer's text
    splitting of them), and an [UNK] only where the vocabulary lacks the text."""
    texts, source = chinese_dir
    corpus = write_jsonl(tmp_path / "c.jsonl", [f"{texts[0]} [MASK] [CLS] [SEP] {texts[1]}", *texts[2:]])
    prepare(PrepareConfig(input=InputConfig(inputs=[str(corpus)]), out_dir=tmp_path / "data", existing_tokenizer=source,
                          cleaning=CleaningConfig(valid_fraction=0.0)), log=lambda message: None)
    for document in _documents(tmp_path / "data", splits=("train",)):
        assert not set(document) & {0, 101, 102, 103}


def test_data_prepared_before_special_ids_reads_as_the_fixed_ids(stored_run):
    """tests/fixtures/old_run_dir.tar.xz: a manifest without `special_ids` packs and masks with 0-4."""
    data_dir = stored_run.parent / "data"
    assert "special_ids" not in json.loads((data_dir / "manifest.json").read_text())
    corpus = open_corpus(data_dir, "train")
    assert corpus.special_ids == DEFAULT
    batch = PretrainBatches(corpus, seed=0).next_batch(seq_len=32, micro_batch_size=4)
    assert (batch["input_ids"][:, 0] == 2).all()

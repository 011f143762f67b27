"""SentencePiece tokenizer: fixed special ids; transformers loads it and gives identical ids."""
from __future__ import annotations

import numpy as np
import pytest
from transformers import AutoTokenizer

from data_pipeline import copy_hf_tokenizer_files, load_tokenizer, open_corpus
from data_pipeline.config import CLS_ID, MASK_ID, PAD_ID, SEP_ID, UNK_ID
from tests.support.corpus_files import (
    chinese_paragraphs,
    english_paragraphs,
    prepared_dir,
)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return prepared_dir(tmp_path_factory)


def test_special_ids_are_fixed(data_dir):
    sp = load_tokenizer(data_dir)
    assert [sp.id_to_piece(i) for i in range(5)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert sp.get_piece_size() == 900


@pytest.mark.parametrize("language", ["english", "chinese"])
def test_transformers_tokenizer_gives_identical_ids(data_dir, tmp_path, language):
    export = tmp_path / "export"
    copy_hf_tokenizer_files(data_dir, export)  # what the export job does
    hf = AutoTokenizer.from_pretrained(str(export))
    sp = load_tokenizer(export)
    # Texts beyond the tokenizer's training sample (later files) plus awkward whitespace and symbols.
    texts = english_paragraphs(40)[-300:] if language == "english" else chinese_paragraphs(60)[-300:]
    texts += ["  two  spaces\tand a tab\nnew line  ", "~~~~~~~~~~~~", "-" * 31, "中文 mixed 英文１２３。"]
    mismatches = [t for t in texts if sp.encode(t) != hf(t, add_special_tokens=False)["input_ids"]]
    assert not mismatches, mismatches[:3]
    assert sum(len(sp.encode(t)) for t in texts) > 5000
    text = texts[0]
    assert hf(text)["input_ids"] == [CLS_ID, *sp.encode(text), SEP_ID]
    assert (hf.pad_token_id, hf.unk_token_id, hf.cls_token_id, hf.sep_token_id, hf.mask_token_id) == \
        (PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID)
    assert hf.decode(sp.encode("hello world")) == sp.decode(sp.encode("hello world"))


def test_shards_hold_the_tokenizer_ids_of_the_text(data_dir):
    corpus = open_corpus(data_dir, "train")
    sp = load_tokenizer(data_dir)
    shard = corpus.shards[0]
    first_doc = np.asarray(shard.token_ids[shard.offsets[0]:shard.offsets[1]])
    assert sp.encode(sp.decode(first_doc.tolist())) == first_doc.tolist()
    assert corpus.tokenizer_sha256 == corpus.manifest["tokenizer"]["sha256"]


def test_tokenizer_subcommand_trains_a_loadable_tokenizer(tmp_path):
    from launcher.cli import main as roformer
    from tests.support.corpus_files import write_jsonl

    corpus = write_jsonl(tmp_path / "c.jsonl", english_paragraphs(8))
    out = tmp_path / "tok"
    assert roformer(["data", "tokenizer", "--input", str(corpus), "--out", str(out),
                     "--vocab-size", "400", "--model-type", "unigram"]) == 0
    sp = load_tokenizer(out)
    assert sp.get_piece_size() == 400 and sp.id_to_piece(MASK_ID) == "[MASK]"
    hf = AutoTokenizer.from_pretrained(str(out))
    text = english_paragraphs(8)[0]
    assert hf(text, add_special_tokens=False)["input_ids"] == sp.encode(text)

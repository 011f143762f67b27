"""`roformer data prepare|tokenizer` options that used to be silently ignored or silently changed
(issue 12, item 2): each is refused in one line before anything is written, or, where the data is
still what was asked for, reported in a one-line warning."""
from __future__ import annotations

import json

import pytest

from data_pipeline import load_tokenizer, open_corpus
from launcher.cli import main as roformer
from tests.support.corpus_files import english_paragraphs, prepared_dir, write_jsonl


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A prepared data dir whose tokenizer (vocab 900) the tests reuse."""
    return prepared_dir(tmp_path_factory)


def run(capsys, *args: str) -> tuple[int, list[str]]:
    code = roformer(["data", *args])
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("flags", [["--vocab-size", "999"], ["--model-type", "unigram"],
                                   ["--vocab-size", "999", "--character-coverage", "1.0"]])
def test_training_options_with_a_reused_tokenizer_are_refused(trained, tmp_path, capsys, flags):
    corpus = write_jsonl(tmp_path / "c.jsonl", english_paragraphs(2))
    out = tmp_path / "out"
    code, err = run(capsys, "prepare", "--input", str(corpus), "--out", str(out), "--tokenizer", str(trained), *flags)
    assert code == 2 and len(err) == 1, err
    given = ", ".join(flag for flag in flags if flag.startswith("--"))
    assert err[0].startswith(f"roformer data: error: {given}: options of training a tokenizer, but --tokenizer "
                             f"{trained} (900 pieces) is reused as it is"), err
    assert not out.exists()


@pytest.mark.parametrize("name, flags, message", [
    ("c.jsonl", ["--format", "txt", "--text-field", "body"],
     "--text-field body: applies to jsonl/parquet input only, but every input is read as txt (--format txt, e.g. "),
    ("c.txt", ["--text-field", "body"],
     "--text-field body: applies to jsonl/parquet input only, but every input is read as txt (by extension, e.g. "),
    ("c.jsonl", ["--txt-mode", "paragraph"],
     "--txt-mode paragraph: applies to txt input only, but every input is read as jsonl (by extension, e.g. "),
])
def test_reading_options_for_input_they_do_not_apply_to_are_refused(trained, tmp_path, capsys, name, flags, message):
    corpus = tmp_path / name
    corpus.write_text("".join(json.dumps({"body": text}) + "\n" for text in english_paragraphs(2)))
    for command in (["prepare", "--tokenizer", str(trained)], ["tokenizer"]):
        out = tmp_path / f"out_{command[0]}"
        code, err = run(capsys, *command, "--input", str(corpus), "--out", str(out), *flags)
        assert code == 2 and len(err) == 1 and message in err[0] and str(corpus) in err[0], err
        assert not out.exists()


def test_text_field_reads_that_field(trained, tmp_path, capsys):
    """The refusal above is about the flag being ignored: where it applies, it is used."""
    texts = english_paragraphs(2)[:40]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"body": text, "text": "decoy"}) + "\n" for text in texts))
    out = tmp_path / "out"
    code, err = run(capsys, "prepare", "--input", str(corpus), "--out", str(out), "--tokenizer", str(trained),
                    "--text-field", "body", "--valid-fraction", "0")
    assert code == 0, err
    corpus_read = open_corpus(out, "train")
    sp, shard = load_tokenizer(out), corpus_read.shards[0]
    first = sp.decode(shard.token_ids[shard.offsets[0]:shard.offsets[1]].tolist())
    assert first != "decoy" and "{" not in first and first.split()[0] in texts[0]


def test_vocab_size_beyond_what_the_text_supports_is_a_one_line_warning(tmp_path, capsys):
    corpus = write_jsonl(tmp_path / "c.jsonl", english_paragraphs(2)[:30])
    out = tmp_path / "out"
    code, err = run(capsys, "prepare", "--input", str(corpus), "--out", str(out), "--vocab-size", "1000000",
                    "--valid-fraction", "0.2")
    assert code == 0, err
    made = json.loads((out / "manifest.json").read_text())["tokenizer"]["vocab_size"]
    assert 15 < made < 1_000_000 and load_tokenizer(out).get_piece_size() == made
    warnings = [line for line in err if line.startswith("warning: ")]
    assert warnings == [f"warning: tokenizer: vocab_size 1000000 requested, SentencePiece made {made} pieces (all the "
                        f"sampled text supports); the tokenizer and manifest have {made}: set model.vocab_size: "
                        f"{made}"], err


def test_a_corpus_too_small_for_a_validation_split_fails_at_prepare(trained, tmp_path, capsys):
    corpus = tmp_path / "two.txt"
    corpus.write_text("The first of two documents.\nThe second of two documents.\n")
    out = tmp_path / "out"
    code, err = run(capsys, "prepare", "--input", str(corpus), "--out", str(out), "--tokenizer", str(trained))
    assert code == 2 and len(err) >= 1, err
    assert err[-1] == (f"roformer data: error: {corpus}: valid_fraction 0.01 (--valid-fraction) puts none of the 2 "
                       f"documents kept into the validation split (each goes to validation with that probability, "
                       f"by a hash of its text); give more documents or a larger --valid-fraction")
    assert not out.exists()
    # asking for no validation split is allowed (and gets none)
    code, err = run(capsys, "prepare", "--input", str(corpus), "--out", str(out), "--tokenizer", str(trained),
                    "--valid-fraction", "0")
    assert code == 0, err
    assert json.loads((out / "manifest.json").read_text())["splits"]["train"]["documents"] == 2

"""The bundled retrieval task `wordnet-senses` and the WordNet pretraining corpus share one owner
(data_pipeline/wordnet.py): the corpus the reproduction recipe prepares (`--default-corpus wordnet`)
holds none of the task's dev/test text, yet keeps its training text."""
from __future__ import annotations

import json
import re

from data_pipeline.sources import WORDNET_DIR, _install_wordnet, corpus_dir, default_corpus_files
from data_pipeline.wordnet import read_synsets, retrieval_split, sense_queries
from launcher.reproduce.reproduction_plan import full_preset


def test_the_recipe_corpus_holds_no_dev_or_test_text_of_the_retrieval_task(tmp_path):
    _install_wordnet(corpus_dir(tmp_path) / WORDNET_DIR)
    (path,) = default_corpus_files(tmp_path, ("wordnet",))  # what `data prepare --default-corpus wordnet` reads
    lines = [line for doc in path.read_text(encoding="utf-8").splitlines() for line in json.loads(doc)["text"].split("\n")]
    # A corpus line reads `words: gloss; "example"; ...`: its glosses and its quoted examples.
    glosses = {line.split(": ", 1)[1].partition('"')[0].strip().rstrip(";").strip() for line in lines}
    examples = {example for line in lines for example in re.findall(r'"([^"]+)"', line)}
    rows = sense_queries(read_synsets())
    held_out = [r for r in rows if r.split != "train"]
    assert len(held_out) > 4000 and {r.split for r in held_out} == {"dev", "test"}
    assert not {r.query for r in held_out} & examples
    assert not {text for r in held_out for text in (r.passage, r.negative)} & glosses
    # ... while training rows of words whose senses no dev/test word shares stay in
    held_keys = {k for r in held_out for k in (r.synset, *r.other_synsets)}
    train = [r for r in rows if r.split == "train" and r.synset not in held_keys]
    assert len(train) > 10000 and sum(r.query in examples and r.passage in glosses for r in train) > 0.99 * len(train)
    assert all(retrieval_split(r.word) == r.split for r in rows[:1000])


def test_the_reproduction_recipe_prepares_the_filtered_wordnet_corpus():
    args = full_preset().recipe_prepare_args
    assert "wordnet" in args[args.index("--default-corpus") + 1].split(",")

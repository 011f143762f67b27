"""The bundled retrieval task `wordnet-senses` and the WordNet pretraining corpus share one owner
(data_pipeline/wordnet.py): the corpus the reproduction recipe prepares (`--default-corpus wordnet`)
holds none of the task's dev/test text, yet keeps its training text."""
from __future__ import annotations

import json
import random

from data_pipeline.sources import WORDNET_DIR, _install_wordnet, corpus_dir, default_corpus_files
from data_pipeline.wordnet import read_synsets, retrieval_split, sense_queries
from launcher.reproduce.reproduction_plan import full_preset


def test_the_recipe_corpus_holds_no_dev_or_test_text_of_the_retrieval_task(tmp_path):
    _install_wordnet(corpus_dir(tmp_path) / WORDNET_DIR)
    (path,) = default_corpus_files(tmp_path, ("wordnet",))  # what `data prepare --default-corpus wordnet` reads
    corpus = "\n".join(json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines())
    rows = sense_queries(read_synsets())
    held_out = [r for r in rows if r.split != "train"]
    assert len(held_out) > 4000 and {r.split for r in held_out} == {"dev", "test"}
    for row in random.Random(0).sample(held_out, 150):
        for text in (row.query, row.passage, row.negative):
            assert text not in corpus, (row.split, row.word, text)
    # ... while training rows of words whose senses no dev/test word shares stay in
    held_keys = {k for r in held_out for k in (r.synset, *r.other_synsets)}
    train = [r for r in rows if r.split == "train" and r.synset not in held_keys]
    assert sum(row.query in corpus for row in random.Random(1).sample(train, 100)) >= 95
    assert all(retrieval_split(r.word) == r.split for r in rows[:1000])


def test_the_reproduction_recipe_prepares_the_filtered_wordnet_corpus():
    args = full_preset().recipe_prepare_args
    assert "wordnet" in args[args.index("--default-corpus") + 1].split(",")

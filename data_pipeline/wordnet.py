"""WordNet 3.0 (Debian `wordnet-base`, /usr/share/wordnet/data.*): its synsets, and which of them the
bundled retrieval task holds out.

One owner for both users of WordNet text: the pretraining corpus (data_pipeline.sources.wordnet_documents)
and the bundled retrieval task `wordnet-senses` (launcher.downstream.task_data): a query is a word's
example sentence, its relevant passage the gloss of that sense, the word's other senses' glosses the
hard negatives. Words are split 80/10/10 into train/dev/test by a hash of the word, so every sense of
a word lands in one split; the corpus leaves out every synset the task's dev or test split uses
(`held_out_synsets`), so evaluation never scores text the model was pretrained on.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from data_pipeline.errors import DataError

WORDNET_ROOT = Path("/usr/share/wordnet")
PARTS_OF_SPEECH = ("noun", "verb", "adj", "adv")
MIN_EXAMPLE_CHARS = 12  # shorter "examples" are fragments ("a red apple" is kept, "bang!" not)
MIN_GLOSS_CHARS = 10


@dataclass(frozen=True)
class Synset:
    """One WordNet synset (sense)."""

    key: str  # "<pos>:<offset>", unique over the four data files
    words: tuple[str, ...]  # its lemmas, underscores as spaces, markers like "(a)" removed
    gloss: str  # the definition, without the example sentences
    examples: tuple[str, ...]  # the quoted example sentences
    entry: str  # the whole text after "| " (gloss; "examples"), as the corpus documents show it


def read_synsets(root: Path = WORDNET_ROOT) -> list[Synset]:
    """Every synset of the four data files, in file order (noun, verb, adj, adv)."""
    synsets: list[Synset] = []
    for pos in PARTS_OF_SPEECH:
        path = Path(root) / f"data.{pos}"
        if not path.is_file():
            raise DataError(f"{path}: missing (apt-get install wordnet-base)")
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("  ") or "| " not in line:  # licence header / no gloss
                continue
            head, _, entry = line.partition("| ")
            fields = head.split()
            count = int(fields[3], 16)
            words = tuple(re.sub(r"\(.*\)$", "", fields[4 + 2 * i].replace("_", " ")) for i in range(count))
            entry = entry.strip()
            gloss = entry.partition('"')[0].strip().rstrip(";").strip()
            examples = tuple(e.strip() for e in re.findall(r'"([^"]+)"', entry))
            synsets.append(Synset(f"{pos}:{fields[0]}", words, gloss, examples, entry))
    return synsets


def retrieval_split(word: str) -> str:
    """The bundled retrieval task's split of a word: 80/10/10 by a hash (stable across machines)."""
    bucket = int.from_bytes(hashlib.sha256(word.lower().encode("utf-8")).digest()[:8], "big") % 10
    return "test" if bucket == 0 else "dev" if bucket == 1 else "train"


@dataclass(frozen=True)
class SenseQuery:
    """One row of the retrieval task: a word's example sentence and the glosses of its senses."""

    word: str
    split: str  # retrieval_split(word)
    synset: str  # Synset.key of the relevant sense
    query: str  # the example sentence
    passage: str  # that sense's gloss
    negative: str  # the gloss of another sense of the same word
    other_synsets: tuple[str, ...]  # keys of the word's other senses (the negatives' synsets)


def sense_queries(synsets: list[Synset]) -> list[SenseQuery]:
    """The retrieval task's rows, in WordNet order. A synset gives one row, for the first of its words
    that its first example sentence contains and that has another sense with a different gloss (the
    hard negative: the next such sense in WordNet order, wrapping around)."""
    senses: dict[str, list[Synset]] = {}
    for synset in synsets:
        if len(synset.gloss) >= MIN_GLOSS_CHARS:
            for word in dict.fromkeys(w.lower() for w in synset.words):
                senses.setdefault(word, []).append(synset)
    rows, seen = [], set()
    for synset in synsets:
        examples = [e for e in synset.examples if len(e) >= MIN_EXAMPLE_CHARS]
        if not examples or len(synset.gloss) < MIN_GLOSS_CHARS:
            continue
        query = examples[0]
        for word in dict.fromkeys(w.lower() for w in synset.words):
            others = [s for s in senses.get(word, []) if s.key != synset.key and s.gloss != synset.gloss]
            if not others or word not in query.lower():
                continue
            mine = [s.key for s in senses[word]].index(synset.key)
            after = [s for s in senses[word][mine + 1:] + senses[word][:mine] if s in others]
            if (query, synset.gloss) not in seen:
                seen.add((query, synset.gloss))
                rows.append(SenseQuery(word, retrieval_split(word), synset.key, query, synset.gloss,
                                       after[0].gloss, tuple(s.key for s in others)))
            break
    return rows


def held_out_synsets(synsets: list[Synset]) -> set[str]:
    """Keys of every synset whose text the retrieval task's dev or test split shows (queries, relevant
    passages and hard negatives): a pretraining corpus leaves these out."""
    held: set[str] = set()
    texts: set[str] = set()
    for row in sense_queries(synsets):
        if row.split != "train":
            held.add(row.synset)
            held.update(row.other_synsets)
            texts.update((row.query, row.passage, row.negative))
    # The same sentence or gloss may recur in another synset: that one goes too.
    return held | {s.key for s in synsets if s.gloss in texts or any(e in texts for e in s.examples)}

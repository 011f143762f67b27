"""Real labelled files for the fine-tuning tests, written in tmp directories (never committed).

Text comes from what the set-up step installed (tests/../shared/DATA.md): the movie-review sentences
of the bundled task (binary polarity, as words), their mean human ratings (regression, read from the
vaderSentiment sdist by launcher.downstream.task_data.rated_movie_reviews) and WordNet (text pairs:
an example sentence with its own gloss, label `same`, or with the gloss of another synset, `different`;
and retrieval rows of the bundled `wordnet-senses` task, data_pipeline/wordnet.py).
"""
from __future__ import annotations

import csv
import json
import functools
import random
from pathlib import Path

WORDNET = Path("/usr/share/wordnet")
POLARITY = ("negative", "positive")


def movie_review_rows(tasks_dir: Path, split: str, count: int) -> list[dict]:
    """The first `count` sentences of a bundled movie-reviews split, label as a word."""
    rows = []
    with (Path(tasks_dir) / "movie-reviews" / f"{split}.jsonl").open(encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            rows.append({"text": row["text"], "label": POLARITY[row["label"]]})
            if len(rows) == count:
                break
    return rows


def wordnet_pairs(count: int, seed: int = 0) -> list[dict]:
    """`count` (sentence, gloss, same|different) rows from WordNet's adjective and verb synsets, half each."""
    synsets = []
    for name in ("data.adj", "data.verb"):
        for line in (WORDNET / name).read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("  ") or "| " not in line:
                continue  # the licence header
            gloss, *examples = [part.strip() for part in line.split("| ", 1)[1].split(";")]
            examples = [e.strip('" ') for e in examples if e.startswith('"') and len(e) > 12]
            if examples and len(gloss) > 10:
                synsets.append((examples[0], gloss))
    rng = random.Random(seed)
    rng.shuffle(synsets)
    rows = []
    for i in range(count):
        sentence, gloss = synsets[i]
        if i % 2:
            gloss = synsets[i + count][1]  # another synset's gloss
        rows.append({"sentence": sentence, "gloss": gloss, "label": "different" if i % 2 else "same"})
    return rows


@functools.lru_cache(maxsize=1)
def _sense_queries() -> tuple:
    from data_pipeline.wordnet import read_synsets, sense_queries

    return tuple(sense_queries(read_synsets(WORDNET)))


def wordnet_retrieval_rows(split: str, count: int, words: int = 2) -> list[dict]:
    """Retrieval rows {"question", "answer", "wrong"} from the WordNet senses task's `split`: `count`
    (example sentence, its sense's gloss, another sense's gloss) rows, then for the split's first `words`
    words with several senses the question "what does WORD mean?" once per sense: a string query
    with several relevant passages (its negative then the gloss of a word not asked about)."""
    every = [r for r in _sense_queries() if r.split == split]
    rows = every[:count]
    result = [{"question": r.query, "answer": r.passage, "wrong": r.negative} for r in rows]
    senses: dict[str, list] = {}
    for row in every:
        senses.setdefault(row.word, []).append(row)
    asked = [word for word, found in senses.items() if len(found) >= 2][:words]
    unrelated = [r.passage for r in rows if r.word not in asked]
    for i, word in enumerate(asked):
        result += [{"question": f"what does {word} mean?", "answer": r.passage, "wrong": unrelated[i]}
                   for r in senses[word]]
    return result


def write_rows(path: Path, rows: list[dict]) -> Path:
    """rows -> .csv / .tsv / .jsonl / .json / .parquet by extension (as a spreadsheet or database export would)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv"):
        with path.open("w", encoding="utf-8", newline="") as f:
            if suffix == ".tsv":  # TSV has no quoting: tabs and newlines cannot occur inside a field
                f.write("\t".join(rows[0]) + "\n")
                f.writelines("\t".join(str(v) for v in row.values()) + "\n" for row in rows)
            else:
                writer = csv.DictWriter(f, fieldnames=list(rows[0]))
                writer.writeheader()
                writer.writerows(rows)
    elif suffix == ".jsonl":
        path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    elif suffix == ".json":
        path.write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")
    elif suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), str(path))
    else:
        raise ValueError(f"write_rows: no writer for {suffix}")
    return path

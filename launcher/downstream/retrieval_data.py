"""A retrieval TaskSpec's files: (query, relevant passage) rows, optional hard negatives and a corpus.

Read with launcher.downstream.labelled_files and checked before any compute (empty fields, a repeated
(query, passage) row, a split with fewer than 2 distinct passages, a bad corpus file). A query may have
several relevant passages; evaluation ranks all passages of the split plus the corpus
(`RetrievalSplit.ir_inputs`).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from launcher.downstream.labelled_files import DEV_SPLIT_SEED, read_table, text_column
from launcher.downstream.task_spec import TaskSpec
from launcher.common.errors import UserError


@dataclass
class RetrievalSplit:
    """One split's (query, passage[, negative]) rows, in file order."""

    name: str  # "train", "dev" or "test"
    path: Path
    rows: list[int]  # 1-based record number in `path` of each row
    queries: list[str]
    passages: list[str]  # the relevant passage of each row
    negatives: list[str] | None  # a hard negative per row (None: no negative column)

    def __len__(self) -> int:
        return len(self.queries)

    def subset(self, indices: list[int]) -> "RetrievalSplit":
        pick = lambda values: [values[i] for i in indices]  # noqa: E731
        return RetrievalSplit(self.name, self.path, pick(self.rows), pick(self.queries), pick(self.passages),
                              pick(self.negatives) if self.negatives is not None else None)

    def pool(self, corpus: list[str]) -> list[str]:
        """Every distinct passage a query of this split is ranked against, in first-seen order."""
        return list(dict.fromkeys([*self.passages, *(self.negatives or []), *corpus]))

    def ir_inputs(self, corpus: list[str]) -> tuple[dict[str, str], dict[str, str], dict[str, set[str]]]:
        """(queries qid -> text, passages cid -> text, relevant qid -> {cid}) for the IR evaluator;
        ids are q<i> / d<i> in first-seen order, so the same split always gives the same ids."""
        passage_id = {text: f"d{i}" for i, text in enumerate(self.pool(corpus))}
        query_id = {text: f"q{i}" for i, text in enumerate(dict.fromkeys(self.queries))}
        relevant: dict[str, set[str]] = {}
        for query, passage in zip(self.queries, self.passages):
            relevant.setdefault(query_id[query], set()).add(passage_id[passage])
        return ({qid: text for text, qid in query_id.items()}, {cid: text for text, cid in passage_id.items()},
                relevant)


@dataclass
class RetrievalData:
    """A retrieval task's checked splits and corpus."""

    spec: TaskSpec
    train: RetrievalSplit
    dev: RetrievalSplit
    test: RetrievalSplit | None
    corpus: list[str]  # distinct extra passages of the corpus file, in file order ([] without one)
    task_type: str = "retrieval"

    @property
    def held_out(self) -> RetrievalSplit:
        return self.test if self.test is not None else self.dev


def load_retrieval_task(spec: TaskSpec) -> RetrievalData:
    """Read and check every file of the retrieval task `spec` (errors name file, row and column)."""
    splits = {name: _read_split(name, Path(path), spec) for name, path in spec.files.items()}
    if spec.dev is None:
        splits["train"], splits["dev"] = _hold_out(splits["train"], spec.dev_fraction)
    for split in splits.values():
        distinct = split.pool([])
        if len(distinct) < 2:
            raise UserError(f"{split.path}: {split.name} split has {len(distinct)} distinct passage"
                            f"{'' if len(distinct) == 1 else 's'} (column {spec.text_pair_column!r}); "
                            "ranking needs at least 2")
    corpus: list[str] = []
    if spec.corpus is not None:
        table = read_table(Path(spec.corpus))
        corpus = list(dict.fromkeys(text_column(Path(spec.corpus), table, spec.corpus_text_column)))
    return RetrievalData(spec=spec, train=splits["train"], dev=splits["dev"], test=splits.get("test"), corpus=corpus)


def _read_split(name: str, path: Path, spec: TaskSpec) -> RetrievalSplit:
    table = read_table(path)
    queries = text_column(path, table, spec.text_column)
    passages = text_column(path, table, spec.text_pair_column)
    negatives = None
    if spec.negative_column is not None and (name == "train" or spec.negative_column in table):
        negatives = text_column(path, table, spec.negative_column)
    first_row: dict[tuple[str, str], int] = {}
    for row, pair in enumerate(zip(queries, passages), start=1):
        if pair in first_row:
            raise UserError(f"{path}: row {row}, columns {spec.text_column!r} and {spec.text_pair_column!r}: "
                            f"the same query and passage as row {first_row[pair]} (a relevant passage counted twice)")
        first_row[pair] = row
    return RetrievalSplit(name, path, list(range(1, len(queries) + 1)), queries, passages, negatives)


def _hold_out(train: RetrievalSplit, fraction: float) -> tuple[RetrievalSplit, RetrievalSplit]:
    """(rest of train, dev): a fixed seeded share of train's distinct queries, each with all its rows."""
    queries = list(dict.fromkeys(train.queries))
    random.Random(DEV_SPLIT_SEED).shuffle(queries)
    count = max(1, round(fraction * len(queries)))
    if count >= len(queries):
        raise UserError(f"{train.path}: dev_fraction {fraction} leaves no training queries ({len(queries)} queries)")
    held = set(queries[:count])
    dev = train.subset([i for i, q in enumerate(train.queries) if q in held])
    dev.name = "dev"
    return train.subset([i for i, q in enumerate(train.queries) if q not in held]), dev

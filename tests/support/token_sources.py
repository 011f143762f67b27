"""Which named source each token id of a test corpus belongs to, for corpora whose sources use disjoint alphabets."""
from __future__ import annotations

import numpy as np


def token_source_table(corpus, alphabets) -> np.ndarray:
    """(V,) index in `alphabets` of the source owning each token id; -1 for special ids and pieces
    without letters (a lone '▁')."""
    from data_pipeline.config import NUM_SPECIAL_IDS
    from data_pipeline.tokenizer import load_sentencepiece

    sp = load_sentencepiece(corpus.data_dir / "tokenizer" / "spm.model")
    table = np.full(corpus.vocab_size, -1, dtype=np.int64)
    for i in range(NUM_SPECIAL_IDS, corpus.vocab_size):
        letters = set(sp.id_to_piece(i)) - {"▁"}
        owners = {s for s, alphabet in enumerate(alphabets) if letters & set(alphabet)}
        assert len(owners) <= 1, sp.id_to_piece(i)  # disjoint alphabets: no piece mixes sources
        if owners:
            table[i] = owners.pop()
    return table

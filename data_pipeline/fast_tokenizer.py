"""A transformers fast tokenizer (`tokenizer.json`) behind the few calls the pipeline makes of SentencePiece.

`roformer data prepare --tokenizer DIR` accepts any local transformers tokenizer directory that has a
`tokenizer.json` (WordPiece, BPE, byte-level BPE, Unigram: whatever the `tokenizers` library
serialises), so a corpus can be tokenized with the vocabulary of a model it continues from. The
pipeline asks a tokenizer for its size, the piece of an id and the ids of plain text (no [CLS] /
[SEP]: packing adds those, stream.py / batches.py); `FastTokenizer` answers exactly that, as
`sentencepiece.SentencePieceProcessor` does for our own tokenizers.

Special tokens: wherever the tokenizer has them (`special_ids`, read from special_tokens_map.json /
tokenizer_config.json); `roformer data prepare` writes them into the manifest, and packing and masking
use those (data_pipeline/special_ids.py). Their text inside a document is encoded as plain text.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from data_pipeline.config import SPECIAL_TOKENS
from data_pipeline.errors import DataError
from data_pipeline.special_ids import SpecialIds

TOKENIZER_JSON = "tokenizer.json"
CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json")
"""Files transformers writes beside tokenizer.json; copied along when present."""


class FastTokenizer:
    """`tokenizers.Tokenizer` read from a tokenizer.json, with SentencePieceProcessor's method names."""

    def __init__(self, path: Path):
        from tokenizers import Tokenizer

        self.path = Path(path)
        try:
            self.backend = Tokenizer.from_file(str(self.path))
        except Exception as err:  # tokenizers raises a bare Exception for a malformed file
            raise DataError(f"{self.path}: not a transformers fast tokenizer ({err})") from None
        self.backend.encode_special_tokens = True  # a literal "[MASK]" in a document is text, not the mask id

    def get_piece_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def id_to_piece(self, token_id: int) -> str:
        return self.backend.id_to_token(int(token_id)) or ""

    def piece_to_id(self, piece: str) -> int | None:
        return self.backend.token_to_id(piece)

    def encode(self, texts: list[str], num_threads: int = 1) -> list[list[int]]:
        """Ids of each text without special tokens (`num_threads` is SentencePiece's argument; the
        `tokenizers` library follows TOKENIZERS_PARALLELISM)."""
        return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=False)]

    @property
    def model_type(self) -> str:
        """`WordPiece`, `BPE`, `Unigram`, ... (the manifest's tokenizer.model_type)."""
        return json.loads(self.backend.to_str())["model"]["type"]

    def word_starts(self) -> np.ndarray:
        """(V,) bool: piece begins a word (whole-word masking). WordPiece marks the other pieces
        (continuing_subword_prefix, '##'); the other models mark word starts ('▁' or byte-level 'Ġ')."""
        model = json.loads(self.backend.to_str())["model"]
        pieces = [self.id_to_piece(i) for i in range(self.get_piece_size())]
        if model["type"] == "WordPiece":
            prefix = model.get("continuing_subword_prefix") or "##"
            return np.array([bool(p) and not p.startswith(prefix) for p in pieces], dtype=bool)
        return np.array([p.startswith(("\u2581", "\u0120")) for p in pieces], dtype=bool)


def special_token_names(directory: Path) -> dict[str, str]:
    """role -> token text: special_tokens_map.json / tokenizer_config.json of `directory` when they
    name them (e.g. a tokenizer whose mask token is `<mask>`), else our [PAD] .. [MASK]."""
    names = dict(SPECIAL_TOKENS)
    for file in reversed(CONFIG_FILES):  # special_tokens_map.json wins
        path = Path(directory) / file
        if not path.is_file():
            continue
        try:
            content = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as err:
            raise DataError(f"{path}: not valid JSON ({err})") from None
        for role in names:
            value = content.get(role)
            value = value.get("content") if isinstance(value, dict) else value
            if isinstance(value, str):
                names[role] = value
    return names


def special_ids(path: Path) -> SpecialIds:
    """The ids of the special tokens of the tokenizer.json at `path` (DataError naming one it lacks)."""
    tokenizer = FastTokenizer(path)
    ids = {}
    for role, token in special_token_names(path.parent).items():
        ids[role] = tokenizer.piece_to_id(token)
        if ids[role] is None:
            raise DataError(f"{path}: {role} {token!r} is not in its vocabulary (the data pipeline needs "
                            f"{', '.join(SPECIAL_TOKENS)}; name them in special_tokens_map.json)")
    return SpecialIds(**ids)

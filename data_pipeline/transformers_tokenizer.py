"""A tokenizer directory that only transformers can run, behind the pipeline's few tokenizer calls.

BERT-style directories (`vocab.txt` + `tokenizer_config.json`, e.g. `BertTokenizer`) and the released
Chinese RoFormer models (`RoFormerTokenizer`: jieba word segmentation through rjieba, then WordPiece)
have no `tokenizer.json`, or one that does not hold their Python-side pre-tokenizer (jieba). For them
the ids are whatever `AutoTokenizer.from_pretrained(DIR)` gives, so this wrapper *is* that tokenizer:
`TransformersTokenizer` answers get_piece_size / id_to_piece / piece_to_id / encode like
`sentencepiece.SentencePieceProcessor` (data_pipeline/tokenizer.py picks it for such directories).
Documents are encoded without [CLS]/[SEP] and with special tokens' text split like any other text, so
a literal "[MASK]" in a document never becomes the mask id. `roformer data prepare` opens one per
worker process (each encodes its own files: jieba runs in Python, so `--workers` is the parallelism).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from data_pipeline.errors import DataError
from data_pipeline.special_ids import ROLES, SpecialIds

VOCAB_TXT = "vocab.txt"
JIEBA_CLASSES = ("RoFormerTokenizer", "RoFormerTokenizerFast")
"""tokenizer_class values whose pre-tokenizer (jieba) lives in Python, not in tokenizer.json."""


def tokenizer_class(directory: Path) -> str | None:
    """`tokenizer_class` of DIR/tokenizer_config.json (None when absent or unreadable)."""
    path = Path(directory) / "tokenizer_config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        return None


class TransformersTokenizer:
    """`AutoTokenizer.from_pretrained(directory)` with SentencePieceProcessor's method names."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.auto = load_auto_tokenizer(self.directory)
        self.backend = self.auto.backend_tokenizer
        self._vocab = self.auto.get_vocab()

    def get_piece_size(self) -> int:
        return len(self.auto)

    def id_to_piece(self, token_id: int) -> str:
        return self.backend.id_to_token(int(token_id)) or ""

    def piece_to_id(self, piece: str) -> int | None:
        return self._vocab.get(piece)

    def encode(self, texts: list[str], num_threads: int = 1) -> list[list[int]]:
        """Ids of each text: no [CLS]/[SEP], special tokens' text not matched (`num_threads` unused:
        one worker process is one core)."""
        return self.auto(list(texts), add_special_tokens=False, split_special_tokens=True,
                         verbose=False)["input_ids"]

    @property
    def model_type(self) -> str:
        """`WordPiece`, `BPE`, ... (the manifest's tokenizer.model_type)."""
        return type(self.backend.model).__name__

    def word_starts(self) -> np.ndarray:
        """(V,) bool: piece begins a word (whole-word masking); WordPiece marks the other pieces ('##')."""
        pieces = [self.id_to_piece(i) for i in range(self.get_piece_size())]
        prefix = getattr(self.backend.model, "continuing_subword_prefix", None)
        if prefix:
            return np.array([bool(p) and not p.startswith(prefix) for p in pieces], dtype=bool)
        return np.array([p.startswith(("\u2581", "\u0120")) for p in pieces], dtype=bool)

    def special_ids(self) -> SpecialIds:
        """The ids of the tokenizer's own special tokens (DataError naming one it lacks). transformers
        appends a special token missing from vocab.txt as a new id past the vocabulary, which no
        model of that vocabulary has a row for: refused."""
        listed = None
        if (self.directory / VOCAB_TXT).is_file():
            listed = set((self.directory / VOCAB_TXT).read_text(encoding="utf-8").splitlines())
        ids = {}
        for role in ROLES:
            token = getattr(self.auto, role, None)
            token_id = self._vocab.get(str(token)) if token is not None else None
            if listed is not None and str(token) not in listed:
                token_id = None
            if token_id is None:
                what = f"has no {role}" if token is None else f"{role} {str(token)!r} is not in its vocabulary"
                raise DataError(f"{self.directory}: the tokenizer {what} (the data pipeline needs "
                                f"{', '.join(ROLES)})")
            ids[role] = token_id
        return SpecialIds(**ids)


def load_auto_tokenizer(directory: Path):
    """transformers' AutoTokenizer on a local directory (offline, no remote code), failures as one-line
    DataErrors naming what is missing."""
    directory = Path(directory)
    if not (directory / "tokenizer_config.json").is_file() and not (directory / "config.json").is_file():
        raise DataError(f"{directory}: tokenizer files missing: tokenizer_config.json (AutoTokenizer needs it, "
                        f"or a config.json, to know the tokenizer class)")
    if tokenizer_class(directory) in JIEBA_CLASSES:
        _require_rjieba(directory)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(directory), trust_remote_code=False, local_files_only=True)
    except ImportError as err:
        raise DataError(f"{directory}: transformers cannot load this tokenizer: {err}") from None
    except Exception as err:  # transformers raises OSError, ValueError, KeyError, TypeError ... by case
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DataError(f"{directory}: transformers cannot load this tokenizer ({first})") from None


def _require_rjieba(directory: Path) -> None:
    try:
        import rjieba  # noqa: F401
    except ImportError:
        raise DataError(f"{directory}/tokenizer_config.json: {tokenizer_class(directory)} segments words with "
                        f"jieba, and the rjieba package is not installed (pip install rjieba)") from None

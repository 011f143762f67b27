"""The special token ids of a prepared corpus: read from its manifest, used by packing and masking.

`roformer data prepare` writes the ids its tokenizer gives its special tokens (our SentencePiece:
[PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4; a BERT-style vocab.txt: [PAD]=0 [UNK]=100 [CLS]=101
[SEP]=102 [MASK]=103; any other transformers tokenizer: wherever they are) into the manifest's
`special_ids`. Packing writes [CLS] / [SEP] / [PAD] with them, and masking never picks a special id
nor draws one as a random replacement. A manifest written before the field existed reads as the
fixed ids above (DEFAULT).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from data_pipeline.errors import DataError

ROLES = ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token")
"""The special tokens the pipeline needs, by their transformers names."""


@dataclass(frozen=True)
class SpecialIds:
    """Ids of the five special tokens of one tokenizer."""

    pad_token: int = 0
    """Fills a sequence after its last token (attention mask 0 there)."""
    unk_token: int = 1
    """The tokenizer's unknown token: may occur inside documents, never masked."""
    cls_token: int = 2
    """First token of every packed sequence."""
    sep_token: int = 3
    """Closes every document in the token stream."""
    mask_token: int = 4
    """What a chosen token becomes (replace_with_mask of the time)."""

    def __post_init__(self) -> None:
        ids = self.as_dict()
        for role, value in ids.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise DataError(f"special_ids.{role}: {value!r} is not a token id")
        if len(set(ids.values())) != len(ids):
            raise DataError(f"special_ids: two special tokens share an id ({ids})")

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    @property
    def ids(self) -> np.ndarray:
        """(5,) the special ids, sorted."""
        return np.array(sorted(self.as_dict().values()), dtype=np.int64)

    def is_special(self, ids: np.ndarray) -> np.ndarray:
        """Elementwise: the id is one of the five."""
        return np.isin(ids, self.ids)

    def ordinary(self, vocab_size: int, count: int, rng: np.random.Generator) -> np.ndarray:
        """`count` ids drawn uniformly from the non-special ids of [0, vocab_size). With the special ids
        at 0-4 this is the very draw `rng.integers(5, vocab_size)` made before ids moved (same masks)."""
        drawn = rng.integers(0, vocab_size - len(self.ids), size=count)
        # The k-th non-special id is k plus the number of special ids at or below it.
        for special in self.ids:
            drawn = drawn + (drawn >= special)
        return drawn

    def check_vocabulary(self, vocab_size: int, where: str) -> None:
        """DataError unless every special id is inside the vocabulary and at least one piece is not special
        (text is encoded into those; masking draws its random replacements from them)."""
        for role, value in self.as_dict().items():
            if value >= vocab_size:
                raise DataError(f"{where}: {role} id {value} is outside the vocabulary of {vocab_size} ids")
        if vocab_size <= len(set(self.ids.tolist())):
            raise DataError(f"{where}: the vocabulary holds only its {vocab_size} special pieces, no ordinary piece "
                            f"to encode text with (every word would be [UNK]); use a tokenizer with a vocabulary, "
                            f"or leave out --tokenizer so that `data prepare` trains one")

    @classmethod
    def from_manifest(cls, manifest: dict, where: str = "manifest.json") -> SpecialIds:
        """The manifest's `special_ids`, or the fixed ids of a manifest written before they were recorded."""
        recorded = manifest.get("special_ids")
        if recorded is None:
            return DEFAULT
        if not isinstance(recorded, dict) or set(recorded) != set(ROLES):
            raise DataError(f"{where}: special_ids must map exactly {', '.join(ROLES)} to ids, got {recorded!r}")
        try:
            return cls(**recorded)
        except DataError as err:
            raise DataError(f"{where}: {err}") from None


DEFAULT = SpecialIds()
"""[PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4: our SentencePiece tokenizers, and every older manifest."""

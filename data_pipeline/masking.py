"""MLM masking of one packed sequence: pure function of (ids, rng), no hidden state."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from data_pipeline.errors import DataError
from data_pipeline.special_ids import DEFAULT, SpecialIds

IGNORE_INDEX = -100
NO_POSITION = -1
"""Padding of a batch's `masked_positions` rows (a slot that holds no masked position)."""
_SLOT_MULTIPLE = 8  # slots per row rounded up to this: one shape for a whole stage, aligned for the matmuls


@dataclass
class MaskingConfig:
    """BERT-style masked-LM corruption."""

    mask_prob: float = 0.15
    """Share of maskable (non-special) tokens chosen for prediction."""
    replace_with_mask: float = 0.8
    """Of the chosen tokens: share replaced by [MASK]."""
    replace_with_random: float = 0.1
    """Of the chosen tokens: share replaced by a random non-special token (the rest stay unchanged)."""
    whole_word: bool = False
    """Choose whole words (all pieces from one '▁'-marked piece to the next; each Chinese piece alone)."""

    def __post_init__(self) -> None:
        if not 0.0 < self.mask_prob < 1.0:
            raise DataError(f"masking.mask_prob: {self.mask_prob} must be in (0, 1)")
        for name in ("replace_with_mask", "replace_with_random"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise DataError(f"masking.{name}: {getattr(self, name)} must be in [0, 1]")
        if self.replace_with_mask + self.replace_with_random > 1.0:
            raise DataError("masking.replace_with_mask + replace_with_random: must not exceed 1")


def mask_tokens(ids: np.ndarray, rng: np.random.Generator, cfg: MaskingConfig, vocab_size: int,
                word_starts: np.ndarray | None = None,
                special: SpecialIds = DEFAULT) -> tuple[np.ndarray, np.ndarray]:
    """(T,) ids -> (corrupted ids, labels with IGNORE_INDEX except at chosen positions). Special ids
    (the corpus's, `special`) are never chosen, and random replacements are never special."""
    maskable = ~special.is_special(ids)
    candidates = np.flatnonzero(maskable)
    labels = np.full(ids.shape, IGNORE_INDEX, dtype=np.int64)
    corrupted = ids.copy()
    if len(candidates) == 0:
        return corrupted, labels
    # Stochastic rounding keeps the expected share exactly mask_prob even for short sequences.
    target = int(len(candidates) * cfg.mask_prob + rng.random())
    if target == 0:
        return corrupted, labels
    if cfg.whole_word and word_starts is not None:
        chosen = _choose_whole_words(ids, maskable, candidates, target, rng, word_starts)
    else:
        chosen = np.sort(rng.choice(candidates, size=target, replace=False))
    labels[chosen] = ids[chosen]
    action = rng.random(len(chosen))
    to_mask = action < cfg.replace_with_mask
    to_random = (~to_mask) & (action < cfg.replace_with_mask + cfg.replace_with_random)
    corrupted[chosen[to_mask]] = special.mask_token
    corrupted[chosen[to_random]] = special.ordinary(vocab_size, int(to_random.sum()), rng)
    return corrupted, labels


def masked_slots(seq_len: int, mask_prob: float, most_masked: int = 0) -> int:
    """Slots per row of `masked_positions` for sequences of `seq_len`: room for the most positions
    mask_tokens chooses there (int(candidates * p + u) <= floor((seq_len - 1) * p) + 1, [CLS] is never
    a candidate), and for `most_masked` (a whole-word pick may pass that bound), rounded up to 8. A
    function of (seq_len, mask_prob) except in that rare case, so a stage's batches keep one shape."""
    bound = max(int((seq_len - 1) * mask_prob) + 1, most_masked)
    return -(-bound // _SLOT_MULTIPLE) * _SLOT_MULTIPLE


def masked_positions(labels: np.ndarray, slots: int) -> np.ndarray:
    """(B, T) labels -> (B, slots) int64: each row's masked positions in ascending order, then NO_POSITION."""
    positions = np.full((labels.shape[0], slots), NO_POSITION, dtype=np.int64)
    for row, row_labels in enumerate(labels):
        chosen = np.flatnonzero(row_labels != IGNORE_INDEX)
        positions[row, :len(chosen)] = chosen
    return positions


def _choose_whole_words(ids, maskable, candidates, target, rng, word_starts) -> np.ndarray:
    """Positions of randomly chosen whole words, adding words until `target` tokens are reached."""
    previous_maskable = np.concatenate([[False], maskable[:-1]])
    starts = maskable & (word_starts[ids] | ~previous_maskable)  # (T,)
    word_of = np.cumsum(starts) - 1  # word index of each position (valid where maskable)
    n_words = int(starts.sum())
    cand_words = word_of[candidates]
    sizes = np.bincount(cand_words, minlength=n_words)
    order = rng.permutation(n_words)
    # Greedy prefix in random order; a word that would overshoot is skipped (as in BERT's WWM).
    picked = np.zeros(n_words, dtype=bool)
    total = 0
    for w in order:
        if total >= target:
            break
        if total + sizes[w] > target and total > 0:
            continue
        picked[w] = True
        total += sizes[w]
    return candidates[picked[cand_words]]

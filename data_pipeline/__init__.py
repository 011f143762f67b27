"""Corpora -> SentencePiece tokenizer -> pre-tokenized shards -> packed, masked MLM batches.

Pure: no DeepSpeed, no torch.distributed; the trainer passes rank and world size in.
See docs/data_format.md for the on-disk format and the reader's guarantees.

Names are imported lazily: preparation workers and the set-up step import `data_pipeline.*`
submodules without paying for torch (only the batch reader needs it).
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "PretrainBatches": "data_pipeline.batches",
    "check_state_format": "data_pipeline.batches",
    "DataError": "data_pipeline.errors",
    "DocumentView": "data_pipeline.documents",
    "IGNORE_INDEX": "data_pipeline.masking",
    "MaskingConfig": "data_pipeline.masking",
    "mask_tokens": "data_pipeline.masking",
    "Corpus": "data_pipeline.shards",
    "open_corpus": "data_pipeline.shards",
    "open_corpora": "data_pipeline.shards",
    "read_manifest": "data_pipeline.manifest",
    "SpecialIds": "data_pipeline.special_ids",
    "copy_hf_tokenizer_files": "data_pipeline.tokenizer",
    "load_tokenizer": "data_pipeline.tokenizer",
    "tokenizer_hash": "data_pipeline.tokenizer",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'data_pipeline' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__

"""Corpora -> SentencePiece tokenizer -> pre-tokenized shards -> packed, masked MLM batches.

Pure: no DeepSpeed, no torch.distributed; the trainer passes rank and world size in.
See docs/data_format.md for the on-disk format and the reader's guarantees.
"""
from data_pipeline.batches import PretrainBatches
from data_pipeline.errors import DataError
from data_pipeline.masking import IGNORE_INDEX, MaskingConfig, mask_tokens
from data_pipeline.shards import Corpus, open_corpus, read_manifest
from data_pipeline.tokenizer import copy_hf_tokenizer_files, load_tokenizer, tokenizer_hash

__all__ = ["PretrainBatches", "DataError", "IGNORE_INDEX", "MaskingConfig", "mask_tokens", "Corpus",
           "open_corpus", "read_manifest", "copy_hf_tokenizer_files", "load_tokenizer", "tokenizer_hash"]

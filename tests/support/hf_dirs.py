"""Directories written by plain transformers / tokenizers, with no project code: the "any RoFormer
directory" that `roformer pretrain --init-from` and `roformer data prepare --tokenizer` accept.

The tokenizer is a WordPiece (BERT-style normalisation and pre-tokenisation) trained by the
`tokenizers` library on real English text, its special tokens at the pipeline's fixed ids
([PAD]=0 .. [MASK]=4, as a user would arrange with `special_tokens=[...]` first in the trainer).
"""
from __future__ import annotations

from pathlib import Path

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TINY_HF_MODEL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
                 "max_position_embeddings": 256, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def wordpiece_tokenizer(texts: list[str], vocab_size: int = 700, specials: list[str] = SPECIALS):
    """A transformers PreTrainedTokenizerFast around a WordPiece trained on `texts`."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials))
    cls_id, sep_id = backend.token_to_id("[CLS]"), backend.token_to_id("[SEP]")
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")


def plain_transformers_dir(out: Path, texts: list[str], head: bool = True, safetensors: bool = True,
                           seed: int = 0, vocab_size: int = 700, **config) -> Path:
    """transformers' RoFormerForMaskedLM (or, head=False, a bare RoFormerModel) + its tokenizer, saved
    with save_pretrained into `out` (weights in model.safetensors, or pytorch_model.bin)."""
    import torch
    import transformers

    tokenizer = wordpiece_tokenizer(texts, vocab_size=vocab_size)
    torch.manual_seed(seed)
    hf_config = transformers.RoFormerConfig(vocab_size=len(tokenizer), pad_token_id=0,
                                            **{**TINY_HF_MODEL, **config})
    cls = transformers.RoFormerForMaskedLM if head else transformers.RoFormerModel
    model = cls(hf_config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    if not safetensors:  # what transformers < 5 wrote with safe_serialization=False (5 writes safetensors only)
        torch.save(model.state_dict(), out / "pytorch_model.bin")
        (out / "model.safetensors").unlink()
    tokenizer.save_pretrained(str(out))
    return out

"""Directories written by plain transformers / tokenizers, with no project code: the "any RoFormer
directory" that `roformer pretrain --init-from` and `roformer data prepare --tokenizer` accept.

`plain_transformers_dir`: a WordPiece tokenizer.json (BERT-style normalisation and pre-tokenisation)
trained by the `tokenizers` library on real English text, its special tokens at ids 0-4 (`special_tokens=
[...]` first in the trainer). `roformer_chinese_dir` / `bert_english_tokenizer_dir`: laid out as the hub's
junnyu/roformer_chinese_base (vocab.txt, RoFormerTokenizer with jieba, pytorch_model.bin) and a BERT
English checkpoint's tokenizer (vocab.txt, BertTokenizer), special tokens at BERT's ids (100-103), small.
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


# ---------------------------------------------------------------------------------------- hub-shaped directories
# The special tokens where BERT's vocab.txt has them: [PAD]=0, [unused*] up to 99, then [UNK]=100 [CLS]=101
# [SEP]=102 [MASK]=103 (bert-base-uncased, bert-base-chinese and junnyu/roformer_chinese_base alike).
BERT_HEAD = ["[PAD]", *(f"[unused{i}]" for i in range(1, 100)), "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
BERT_IDS = {"pad_token": 0, "unk_token": 100, "cls_token": 101, "sep_token": 102, "mask_token": 103}
SPECIAL_TOKENS_MAP = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                      "mask_token": "[MASK]"}


def _write_json(path: Path, content: dict) -> None:
    import json

    path.write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_vocab(out: Path, pieces: list[str]) -> list[str]:
    vocab = list(dict.fromkeys([*BERT_HEAD, *pieces]))
    out.mkdir(parents=True, exist_ok=True)
    (out / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    _write_json(out / "special_tokens_map.json", SPECIAL_TOKENS_MAP)
    return vocab


def bert_english_tokenizer_dir(out: Path, texts: list[str], pieces: int = 600) -> Path:
    """A BERT English checkpoint's tokenizer files: vocab.txt (BERT's layout, WordPiece pieces learnt from
    `texts`), tokenizer_config.json naming BertTokenizer (lower case), special_tokens_map.json."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    backend = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=pieces, special_tokens=["[UNK]"]))
    learnt = [p for p, _ in sorted(backend.get_vocab().items(), key=lambda item: item[1]) if p != "[UNK]"]
    _write_vocab(out, learnt)
    _write_json(out / "tokenizer_config.json", {"do_lower_case": True, "tokenizer_class": "BertTokenizer",
                                                "model_max_length": 512})
    return out


def roformer_chinese_tokenizer_dir(out: Path, texts: list[str], words: int = 300) -> list[str]:
    """junnyu/roformer_chinese_base's tokenizer files, small: vocab.txt in BERT's layout with every
    character of `texts` and its `words` most frequent jieba words, tokenizer_config.json naming
    RoFormerTokenizer, special_tokens_map.json. Returns the vocabulary."""
    from collections import Counter

    import rjieba

    counts: Counter = Counter()
    chars: Counter = Counter()
    for text in texts:
        counts.update(w for w in rjieba.cut(text.lower(), False) if len(w) > 1 and not w.isspace())
        chars.update(c for c in text.lower() if not c.isspace())
    ascii_pieces = [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz0123456789"]
    vocab = _write_vocab(out, [*sorted(chars), *ascii_pieces, *(w for w, _ in counts.most_common(words))])
    _write_json(out / "tokenizer_config.json", {"do_lower_case": True, "tokenizer_class": "RoFormerTokenizer"})
    return vocab


def roformer_chinese_dir(out: Path, texts: list[str], words: int = 300, seed: int = 0,
                         safetensors: bool = False) -> Path:
    """A directory laid out as junnyu/roformer_chinese_base, small: config.json (RoFormer with
    embedding_size, max_position_embeddings 1536, rotary_value false, BERT's ids), pytorch_model.bin
    (random weights; model.safetensors with `safetensors`) and the tokenizer files
    (roformer_chinese_tokenizer_dir)."""
    import torch
    import transformers

    vocab = roformer_chinese_tokenizer_dir(out, texts, words)
    config = {"architectures": ["RoFormerForMaskedLM"], "attention_probs_dropout_prob": 0.0, "embedding_size": 32,
              "hidden_act": "gelu", "hidden_dropout_prob": 0.0, "hidden_size": 32, "initializer_range": 0.02,
              "intermediate_size": 64, "layer_norm_eps": 1e-12, "max_position_embeddings": 1536,
              "model_type": "roformer", "num_attention_heads": 2, "num_hidden_layers": 2, "pad_token_id": 0,
              "rotary_value": False, "type_vocab_size": 2, "use_cache": True, "vocab_size": len(vocab)}
    _write_json(out / "config.json", config)
    torch.manual_seed(seed)
    model = transformers.RoFormerForMaskedLM(transformers.RoFormerConfig.from_pretrained(str(out)))
    if safetensors:
        model.save_pretrained(str(out))
        _write_json(out / "config.json", config)  # the hub's file, not the one save_pretrained rewrote
    else:
        torch.save(model.state_dict(), out / "pytorch_model.bin")
    return out


def bert_dir(out: Path, texts: list[str], head: bool = True, safetensors: bool = True, seed: int = 0,
             **config) -> Path:
    """transformers' BertForMaskedLM (or, head=False, a BertModel with its pooler) saved by save_pretrained
    (model.safetensors, or pytorch_model.bin), with a BERT English checkpoint's tokenizer files
    (bert_english_tokenizer_dir: a WordPiece vocab.txt trained by `tokenizers` on `texts`)."""
    import torch
    import transformers

    bert_english_tokenizer_dir(out, texts)
    vocab_size = len((out / "vocab.txt").read_text(encoding="utf-8").splitlines())
    torch.manual_seed(seed)
    bert_config = transformers.BertConfig(vocab_size=vocab_size, pad_token_id=0, **{**TINY_HF_MODEL, **config})
    model = (transformers.BertForMaskedLM if head else transformers.BertModel)(bert_config)
    model.save_pretrained(str(out))
    if not safetensors:  # what transformers < 5 wrote with safe_serialization=False
        torch.save(model.state_dict(), out / "pytorch_model.bin")
        (out / "model.safetensors").unlink()
    return out

"""SentencePiece training with fixed special ids, and the transformers-loadable copy of it.

`tokenizer/spm.model` is the source of truth; `tokenizer.json` is built from it with transformers'
own SpmConverter (same normalizer charsmap, same pieces and scores), so
`AutoTokenizer.from_pretrained(dir)` yields the same ids (tests/unit/test_data_tokenizer.py checks).
A tokenizer taken from elsewhere (`roformer data prepare --tokenizer DIR`: an export, or any
transformers tokenizer directory) has an spm.model, else a `tokenizer.json` (data_pipeline/fast_tokenizer.py),
else a BERT-style `vocab.txt` read through transformers itself (data_pipeline/transformers_tokenizer.py;
also a RoFormerTokenizer, whose jieba segmentation no tokenizer.json holds): that file is the source of
truth, its sha256 the tokenizer's fingerprint, and its special ids (`tokenizer_special_ids`) go into
the manifest. Our own SentencePiece tokenizers have theirs at [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4.
The special tokens are SentencePiece *control* symbols: text containing a literal "[MASK]" is not
turned into the mask id by SentencePiece (the transformers tokenizer does match literal special
tokens, the one documented difference).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import unicodedata
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from data_pipeline.config import (CLS_ID, MASK_ID, PAD_ID, SEP_ID, SPECIAL_TOKENS, UNK_ID,
                                  TokenizerConfig)
from data_pipeline.errors import DataError
from data_pipeline.fast_tokenizer import CONFIG_FILES, TOKENIZER_JSON, FastTokenizer
from data_pipeline.fast_tokenizer import special_ids as fast_special_ids
from data_pipeline.special_ids import DEFAULT, SpecialIds
from data_pipeline.transformers_tokenizer import (JIEBA_CLASSES, VOCAB_TXT, TransformersTokenizer,
                                                  tokenizer_class)
from data_pipeline.progress import sentencepiece_log

SPM_FILE = "spm.model"
HF_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
SOURCE_FILES = (SPM_FILE, TOKENIZER_JSON, VOCAB_TXT)
"""A tokenizer's source-of-truth file, in the order looked for."""


def _sentencepiece_reason(message: str, cfg: TokenizerConfig) -> str:
    """SentencePiece's error in our flags' words (its own advice names its flags, not ours)."""
    import re

    chars = re.search(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)", message)
    if chars:
        needed = int(chars.group(2))
        return (f"--vocab-size {cfg.vocab_size}: smaller than the {needed:,} distinct characters SentencePiece keeps "
                f"at --character-coverage {cfg.character_coverage:g} (each needs a piece of its own); give "
                f"--vocab-size {needed + 8} or more (characters and special tokens), or a lower --character-coverage")
    return f"tokenizer: SentencePiece training failed: {message.strip().splitlines()[-1] if message.strip() else message}"


def train_sentencepiece(sample_files: list[Path], out_dir: Path, cfg: TokenizerConfig,
                        threads: int = 1, log=None) -> Path:
    """Train on the sampled text files; write out_dir/spm.model and the transformers files.

    SentencePiece stops below cfg.vocab_size when the sample holds no more pieces
    (hard_vocab_limit=False); `log` then gets a one-line warning with the size made. With a `log`,
    training reports its progress there (data_pipeline/progress.py reads SentencePiece's own log)."""
    import sentencepiece as spm

    files = [str(p) for p in sample_files if p.stat().st_size > 0]
    if not files:
        raise DataError("tokenizer: the train split has no text to train SentencePiece on")
    out_dir.mkdir(parents=True, exist_ok=True)
    prefix = out_dir / "spm"
    # With a log, SentencePiece logs everything (minloglevel 0) and sentencepiece_log turns it into
    # progress lines; without one, errors only.
    watch = sentencepiece_log(cfg.vocab_size, log) if log is not None else contextlib.nullcontext()
    try:
        with watch:
            spm.SentencePieceTrainer.train(
                input=files, model_prefix=str(prefix), vocab_size=cfg.vocab_size,
                model_type=cfg.model_type, character_coverage=cfg.character_coverage,
                input_sentence_size=cfg.input_sentence_size, shuffle_input_sentence=True,
                pad_id=PAD_ID, unk_id=UNK_ID, bos_id=-1, eos_id=-1,
                pad_piece="[PAD]", unk_piece="[UNK]",
                control_symbols=["[CLS]", "[SEP]", "[MASK]"],  # ids 2, 3, 4 (after pad and unk)
                num_threads=threads, minloglevel=0 if log is not None else 2, train_extremely_large_corpus=False,
                hard_vocab_limit=False)
    except RuntimeError as err:  # e.g. vocab_size larger than the sample allows
        raise DataError(_sentencepiece_reason(str(err), cfg)) from None
    (out_dir / "spm.vocab").unlink(missing_ok=True)
    check_special_ids(out_dir / SPM_FILE)
    made = load_sentencepiece(out_dir / SPM_FILE).get_piece_size()
    if made != cfg.vocab_size and log is not None:
        log(f"warning: tokenizer: vocab_size {cfg.vocab_size} requested, SentencePiece made {made} pieces (all "
            f"the sampled text supports); the tokenizer and manifest have {made}: set model.vocab_size: {made}")
    write_hf_tokenizer_files(out_dir)
    return out_dir / SPM_FILE


def tokenizer_special_ids(model_path: Path, tokenizer=None) -> SpecialIds:
    """The special ids of the tokenizer whose source-of-truth file is `model_path` (DataError naming a
    special token it lacks); `tokenizer` is that tokenizer (open_tokenizer) when already open."""
    model_path = Path(model_path)
    if model_path.name == SPM_FILE:
        check_special_ids(model_path)
        return DEFAULT
    tokenizer = tokenizer if tokenizer is not None else open_tokenizer(model_path)
    if isinstance(tokenizer, TransformersTokenizer):
        return tokenizer.special_ids()
    return fast_special_ids(model_path)


def check_special_ids(model_path: Path) -> None:
    """Raise DataError unless [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4 in this spm.model (ours)."""
    sp = load_sentencepiece(model_path)
    expected = {"[PAD]": PAD_ID, "[UNK]": UNK_ID, "[CLS]": CLS_ID, "[SEP]": SEP_ID, "[MASK]": MASK_ID}
    for piece, want in expected.items():
        if sp.id_to_piece(want) != piece:
            raise DataError(f"{model_path}: id {want} is {sp.id_to_piece(want)!r}, expected {piece!r} "
                            "(special ids must be [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4)")


def load_sentencepiece(model_path: Path):
    import sentencepiece as spm

    if not Path(model_path).is_file():
        raise DataError(f"{model_path}: SentencePiece model not found")
    try:
        return spm.SentencePieceProcessor(model_file=str(model_path))
    except (RuntimeError, OSError) as err:
        raise DataError(f"{model_path}: not a SentencePiece model ({err})") from err


def load_tokenizer(path: Path):
    """The tokenizer of a prepared data dir, its tokenizer/ dir, an export, a transformers tokenizer
    dir, an spm.model or a tokenizer.json (see `open_tokenizer`)."""
    return open_tokenizer(resolve_model_path(path))


def open_tokenizer(model_path: Path):
    """A SentencePieceProcessor for an spm.model; with the same method names, a FastTokenizer for a
    tokenizer.json, a TransformersTokenizer (AutoTokenizer) for a vocab.txt or a jieba RoFormerTokenizer."""
    model_path = Path(model_path)
    if model_path.name == VOCAB_TXT or (model_path.name == TOKENIZER_JSON
                                        and tokenizer_class(model_path.parent) in JIEBA_CLASSES):
        return TransformersTokenizer(model_path.parent)
    if model_path.name == TOKENIZER_JSON:
        return FastTokenizer(model_path)
    return load_sentencepiece(model_path)


def resolve_model_path(path: Path) -> Path:
    """The tokenizer's source-of-truth file: an spm.model when there is one (ours), else a transformers
    tokenizer.json, else a BERT-style vocab.txt; `path` is that file, its directory or a prepared data
    dir (tokenizer/)."""
    path = Path(path)
    for name in SOURCE_FILES:
        for candidate in (path, path / name, path / "tokenizer" / name):
            if candidate.is_file() and candidate.name == name:
                return candidate
    raise DataError(f"{path}: no tokenizer: none of {', '.join(SOURCE_FILES)} (also looked in tokenizer/); a "
                    f"transformers tokenizer directory has {TOKENIZER_JSON} or {VOCAB_TXT}")


def tokenizer_hash(model_path: Path) -> str:
    """sha256 of the tokenizer's source-of-truth file (spm.model or tokenizer.json): shards record it,
    runs compare it."""
    return hashlib.sha256(Path(model_path).read_bytes()).hexdigest()


def write_hf_tokenizer_files(tok_dir: Path) -> None:
    """tokenizer.json (+ config files) from tok_dir/spm.model so AutoTokenizer can load tok_dir."""
    from tokenizers import processors
    _Converter = _converter_class()
    model_path = tok_dir / SPM_FILE
    original = SimpleNamespace(vocab_file=str(model_path), add_prefix_space=True, legacy=True)
    fast = _Converter(original).converted()
    # Fine-tuning inputs look like pretraining sequences: [CLS] first, [SEP] after each text.
    fast.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", CLS_ID), ("[SEP]", SEP_ID)])
    _atomic_write(tok_dir / "tokenizer.json", fast.to_str(pretty=False))
    sp = load_sentencepiece(model_path)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1_000_000,
              "padding_side": "right", "clean_up_tokenization_spaces": False,
              "vocab_size": sp.get_piece_size(), **SPECIAL_TOKENS}
    _atomic_write(tok_dir / "tokenizer_config.json", json.dumps(config, indent=2))
    _atomic_write(tok_dir / "special_tokens_map.json", json.dumps(SPECIAL_TOKENS, indent=2))


def _converter_class():
    from tokenizers import AddedToken, Tokenizer
    from tokenizers.models import BPE
    from transformers.convert_slow_tokenizer import SpmConverter, generate_merges

    class Converter(SpmConverter):
        """transformers' converter, with BPE merges ordered by SentencePiece piece score."""

        def tokenizer(self, proto):
            if proto.trainer_spec.model_type != 2:  # unigram: transformers' own path
                return super().tokenizer(proto)
            vocab_scores = self.vocab(proto)
            vocab = {piece: i for i, (piece, _) in enumerate(vocab_scores)}
            merges = generate_merges(vocab, vocab_scores)
            tok = Tokenizer(BPE(vocab, merges, unk_token=proto.trainer_spec.unk_piece, fuse_unk=True,
                                byte_fallback=False, dropout=None))
            tok.add_tokens([AddedToken(p.piece, normalized=False, special=True)
                            for p in proto.pieces if p.type == 3])  # control symbols
            return tok

    return Converter


def tokenizer_files(src: Path) -> tuple[str, ...]:
    """The files making up the tokenizer in directory `src` (DataError naming any that is missing): ours
    (spm.model + the transformers files), or a transformers tokenizer.json and/or vocab.txt with its
    config files."""
    if (src / SPM_FILE).is_file():
        names = (SPM_FILE, *HF_FILES)
    elif (src / TOKENIZER_JSON).is_file() or (src / VOCAB_TXT).is_file():
        names = tuple(n for n in (TOKENIZER_JSON, VOCAB_TXT, *CONFIG_FILES) if (src / n).is_file())
        if "tokenizer_config.json" not in names:  # AutoTokenizer needs it to know the class
            raise DataError(f"{src}: tokenizer files missing: tokenizer_config.json")
    else:
        names = (SPM_FILE, *HF_FILES)
    missing = [n for n in names if not (src / n).is_file()]
    if missing:
        raise DataError(f"{src}: tokenizer files missing: {', '.join(missing)}")
    return names


def copy_hf_tokenizer_files(data_dir: Path, out_dir: Path) -> list[Path]:
    """Copy the tokenizer of a prepared data dir (or a tokenizer dir) into an export dir, byte for byte."""
    src = Path(data_dir) / "tokenizer"
    if not any((src / name).is_file() for name in SOURCE_FILES):
        src = Path(data_dir)  # also accept the tokenizer dir itself
    names = tokenizer_files(src)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in names:
        tmp = out_dir / f".{name}.tmp"
        shutil.copyfile(src / name, tmp)
        os.replace(tmp, out_dir / name)
        copied.append(out_dir / name)
    return copied


def word_start_table(sp) -> np.ndarray:
    """(V,) bool: piece begins a word for whole-word masking.

    A piece starts a word when it carries SentencePiece's boundary marker '▁', or when it begins
    with a CJK character: Chinese has no spaces, so each Chinese piece is its own unit.
    """
    if isinstance(sp, (FastTokenizer, TransformersTokenizer)):
        marked = sp.word_starts()
        return marked | np.array([bool(p) and _is_cjk(p[0]) for p in map(sp.id_to_piece, range(len(marked)))])
    table = np.zeros(sp.get_piece_size(), dtype=bool)
    for i in range(sp.get_piece_size()):
        piece = sp.id_to_piece(i)
        table[i] = piece.startswith("\u2581") or (bool(piece) and _is_cjk(piece[0]))
    return table


def _is_cjk(ch: str) -> bool:
    return unicodedata.east_asian_width(ch) in ("W", "F")


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)

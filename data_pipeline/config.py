"""Options of corpus preparation and tokenizer training, one dataclass per concern.

Every field is validated in `__post_init__`; errors name the field (DataError, shown as one line).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from data_pipeline.errors import DataError

# Special ids of every tokenizer we train (SentencePiece); other tokenizers have theirs wherever they are,
# recorded in the data manifest (data_pipeline/special_ids.py, docs/INTERFACES.md).
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = 0, 1, 2, 3, 4
SPECIAL_TOKENS = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]",
                  "sep_token": "[SEP]", "mask_token": "[MASK]"}
NUM_SPECIAL_IDS = 5  # the special pieces at the start of our SentencePiece vocabularies
MIN_SEQ_LEN = 2  # a packed sequence is [CLS] plus at least one token

DEFAULT_SOURCE = "default"
"""Name of the one source of plain `--input` files (and of every manifest from before named sources)."""
SOURCE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""A source name: used as a YAML key in stage mixtures and shown in tables, so plain characters only."""

FORMATS = ("auto", "txt", "jsonl", "parquet")
TXT_MODES = ("line", "paragraph")
ORDERS = ("global", "shard_window")
"""The token stream's document orders (data_pipeline/stream.py; the run config's data.order)."""


def check_source_name(name: object, where: str = "source") -> str:
    """`name` if it is a valid source name, else DataError naming `where`."""
    if not isinstance(name, str) or not SOURCE_NAME.fullmatch(name):
        raise DataError(f"{where}: source name {name!r} must be 1-64 letters, digits, '_', '.' or '-', "
                        f"starting with a letter or digit")
    return name


@dataclass
class SourceSpec:
    """One named source of a prepared dataset: its own shards and validation split."""

    name: str
    """Mixture key (schedule stages' `mixture`), manifest and report name."""
    inputs: list[str]
    """Files, directories or globs, as `InputConfig.inputs`."""


@dataclass
class InputConfig:
    """How raw documents are found and read."""

    inputs: list[str] = field(default_factory=list)
    """Files, directories (searched recursively for known extensions) or glob patterns: the source
    named DEFAULT_SOURCE (listed first when there are named sources too)."""
    sources: list[SourceSpec] = field(default_factory=list)
    """Named sources (`--source NAME=PATH,...`, `--default-corpus en,zh`), after `inputs`' source."""
    text_format: str = "auto"
    """`auto` (from the extension: .txt[.gz], .jsonl/.json[.gz], .parquet) or one of txt/jsonl/parquet."""
    txt_mode: str = "line"
    """For .txt: `line` = one document per line, `paragraph` = blank-line-separated blocks."""
    text_field: str = "text"
    """Field holding the document text in JSONL records and parquet columns."""
    lenient: bool = False
    """Skip (count and log) bad lines and empty files instead of failing at the first one."""

    def __post_init__(self) -> None:
        if not self.inputs and not self.sources:
            raise DataError("inputs: at least one input file, directory or glob is required")
        seen = set()
        for spec in self.named_sources():
            check_source_name(spec.name, f"--source {spec.name}")
            if spec.name in seen:
                plain = f"; plain --input files are the source {DEFAULT_SOURCE!r}" if spec.name == DEFAULT_SOURCE else ""
                raise DataError(f"--source {spec.name}: source name given twice (each source needs its own name{plain})")
            seen.add(spec.name)
            if not spec.inputs:
                raise DataError(f"--source {spec.name}: no input files, directories or globs")
        if self.text_format not in FORMATS:
            raise DataError(f"text_format: {self.text_format!r} is not one of {', '.join(FORMATS)}")
        if self.txt_mode not in TXT_MODES:
            raise DataError(f"txt_mode: {self.txt_mode!r} is not one of {', '.join(TXT_MODES)}")
        if not self.text_field:
            raise DataError("text_field: must be a non-empty field name")

    def named_sources(self) -> list[SourceSpec]:
        """Every source in order: plain `inputs` (as DEFAULT_SOURCE) first, then `sources`."""
        return ([SourceSpec(DEFAULT_SOURCE, list(self.inputs))] if self.inputs else []) + list(self.sources)

    def all_inputs(self) -> list[str]:
        """Every source's inputs, in source order."""
        return [spec for source in self.named_sources() for spec in source.inputs]


@dataclass
class CleaningConfig:
    """Per-document normalization, de-duplication, splitting and capping."""

    nfkc: bool = False
    """Apply Unicode NFKC normalization (SentencePiece's own nmt_nfkc runs anyway at tokenization)."""
    strip_control: bool = True
    """Remove control characters other than newline and tab."""
    dedup: bool = True
    """Drop exact duplicate documents (first occurrence wins); costs 16 bytes of memory per document."""
    valid_fraction: float = 0.01
    """Fraction of documents assigned to the validation split by a hash of their text."""
    max_documents: int | None = None
    """Read at most this many documents of each source (in input order); None = all. For quick demos."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.valid_fraction < 1.0:
            raise DataError(f"valid_fraction: {self.valid_fraction} must be in [0, 1)")
        if self.max_documents is not None and self.max_documents < 1:
            raise DataError(f"max_documents: {self.max_documents} must be >= 1")


@dataclass
class TokenizerConfig:
    """SentencePiece training."""

    vocab_size: int = 8000
    """Vocabulary size including the 5 special tokens."""
    model_type: str = "bpe"
    """`bpe` (default: the transformers tokenizer reproduces its ids exactly) or `unigram` (transformers
    may break ties between equal-score segmentations of repeated characters, e.g. '-----', differently)."""
    sample_bytes: int = 50_000_000
    """Bound on the text (bytes) sampled, by document hash, from the train split for training."""
    input_sentence_size: int = 1_000_000
    """Bound on the lines SentencePiece keeps from that sample (it shuffles them)."""
    character_coverage: float = 0.9995
    """Share of characters covered by the vocabulary (0.9995 suits Chinese + English)."""

    def __post_init__(self) -> None:
        if self.vocab_size < NUM_SPECIAL_IDS + 10:
            raise DataError(f"vocab_size: {self.vocab_size} is too small (need >= {NUM_SPECIAL_IDS + 10})")
        if self.model_type not in ("unigram", "bpe"):
            raise DataError(f"model_type: {self.model_type!r} is not one of unigram, bpe")
        if self.sample_bytes < 1 or self.input_sentence_size < 1:
            raise DataError("sample_bytes / input_sentence_size: must be positive")
        if not 0.9 <= self.character_coverage <= 1.0:
            raise DataError(f"character_coverage: {self.character_coverage} must be in [0.9, 1]")


@dataclass
class PrepareConfig:
    """Everything `roformer data prepare` needs."""

    input: InputConfig
    out_dir: Path
    """Prepared data directory (manifest.json, tokenizer/, train/, valid/)."""
    cleaning: CleaningConfig = field(default_factory=CleaningConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    existing_tokenizer: Path | None = None
    """Reuse this spm.model (or a prepared data dir's tokenizer/) instead of training one."""
    workers: int = 1
    """Worker processes for reading and tokenizing (parallel over input files)."""
    shard_tokens: int = 1 << 25
    """Roll over to a new shard after about this many tokens."""
    overwrite: bool = False
    """Replace an existing prepared directory at out_dir."""

    def __post_init__(self) -> None:
        self.out_dir = Path(self.out_dir)
        if self.workers < 1:
            raise DataError(f"workers: {self.workers} must be >= 1")
        if self.shard_tokens < 1:
            raise DataError(f"shard_tokens: {self.shard_tokens} must be >= 1")

    def options_for_manifest(self) -> dict:
        d = asdict(self)
        d["out_dir"] = str(self.out_dir)
        d["existing_tokenizer"] = str(self.existing_tokenizer) if self.existing_tokenizer else None
        return d

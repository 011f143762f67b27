"""Open an export (or any transformers-format RoFormer directory) for evaluation and fine-tuning.

Checks come first and name the file: config.json, weights (model.safetensors only: no pickle from
foreign directories), the tokenizer files, the checksums our exports record in export_info.json
(a flipped bit in a safetensors data block is otherwise invisible), and finite weights.
"""
from __future__ import annotations

import json
from pathlib import Path

from launcher.common.errors import UserError
from launcher.common.io import file_sha256

EXPORT_INFO = "export_info.json"
VOCABULARY_FILES = ("tokenizer.json", "vocab.txt")
"""The vocabulary of a transformers tokenizer: a fast tokenizer's tokenizer.json or a BERT-style vocab.txt."""


def check_export_dir(path: Path) -> Path:
    """Validate the directory before anything heavy is loaded; returns it."""
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"{path}: export directory not found")
    if not (path / "config.json").is_file():
        raise UserError(f"{path}/config.json: missing (not a transformers model directory)")
    weights = path / "model.safetensors"
    if not weights.is_file():
        raise UserError(f"{weights}: missing (only safetensors weights are read)")
    missing = [name for name in ("tokenizer_config.json",) if not (path / name).is_file()]
    if not any((path / name).is_file() for name in VOCABULARY_FILES):
        missing.insert(0, " or ".join(VOCABULARY_FILES))
    if missing:
        raise UserError(f"{path}: tokenizer missing ({', '.join(missing)} not found)")
    _check_recorded_checksums(path)
    _check_safetensors(weights)
    return path


def _check_recorded_checksums(path: Path) -> None:
    info_path = path / EXPORT_INFO
    if not info_path.is_file():
        return  # a foreign transformers directory: structural checks only
    try:
        recorded = json.loads(info_path.read_text(encoding="utf-8")).get("sha256", {})
    except ValueError as err:
        raise UserError(f"{info_path}: not valid JSON ({err})") from None
    for name, digest in recorded.items():
        file = path / name
        if file.is_file() and file_sha256(file) != digest:
            raise UserError(f"{file}: corrupt (sha256 differs from the one recorded at export in {EXPORT_INFO})")


def _check_safetensors(weights: Path) -> None:
    """Header, offsets and values: a truncated or garbled file is reported here by name."""
    import torch
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(weights), framework="pt") as f:
            for key in f.keys():
                tensor = f.get_tensor(key)
                if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                    raise UserError(f"{weights}: corrupt: tensor {key} holds NaN or infinite values")
    except UserError:
        raise
    except SafetensorError as err:
        raise UserError(f"{weights}: corrupt safetensors file ({err})") from None
    except (OSError, ValueError, RuntimeError) as err:
        raise UserError(f"{weights}: unreadable safetensors file ({err})") from None


def load_auto_tokenizer(path: Path):
    """transformers' AutoTokenizer on the export (no remote code); special tokens checked."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except (OSError, ValueError, KeyError) as err:
        raise UserError(f"{path}: tokenizer cannot be loaded: {err}") from None
    if tokenizer.pad_token_id is None:
        raise UserError(f"{path}/tokenizer_config.json: no pad token (needed to batch texts)")
    return tokenizer


def load_masked_lm(path: Path, random_init: bool = False):
    """The export's masked-LM model; with `random_init`, its random-init twin (same config, weights from
    torch seed 0), the baseline that shows what pretraining learned."""
    from roformer.hf_interop import load_pretrained, read_hf_directory

    check_export_dir(path)
    if random_init:
        import torch

        from roformer import RoFormerForMaskedLM

        config, _, _ = read_hf_directory(path)
        torch.manual_seed(0)
        return RoFormerForMaskedLM(config).eval()
    return load_pretrained(path).eval()


def load_classifier(path: Path, num_labels: int, random_init: bool = False, dropout: float | None = None):
    """The export's encoder + a fresh head; with `random_init`, its random-init twin (same config,
    weights from the current torch seed), for measuring what pretraining bought. `dropout` replaces
    the export's hidden and attention dropout probabilities (None keeps them)."""
    import dataclasses

    from roformer import RoFormerForSequenceClassification
    from roformer.hf_interop import load_classifier_from_pretrained, read_hf_directory

    check_export_dir(path)
    changes = {} if dropout is None else {"hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}
    if random_init:
        config, _, _ = read_hf_directory(path)
        return RoFormerForSequenceClassification(dataclasses.replace(config, **changes), num_labels)
    return load_classifier_from_pretrained(path, num_labels, **changes)


def trained_max_seq_len(path: Path) -> int | None:
    """Longest sequence length seen in pretraining, when the export records it."""
    info_path = Path(path) / EXPORT_INFO
    if not info_path.is_file():
        return None
    try:
        value = json.loads(info_path.read_text(encoding="utf-8")).get("max_seq_len_trained")
    except ValueError:
        return None
    return value if isinstance(value, int) else None

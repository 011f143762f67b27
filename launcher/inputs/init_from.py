"""What a run continued from a model directory (`init_from`, `pretrain --init-from DIR`) reads of DIR.

DIR is our export, a transformers RoFormer directory, or a BERT (roformer/bert_interop.py). From it come
the model section (its config.json under the run config's own `model:` keys: run_config.model_over_init),
the weights on a fresh start only (launcher/train/init_weights.py), and the tokenizer the data must have
been prepared with (its fingerprint against the manifest's). docs/training.md, "Continuing from an
existing model".
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from launcher.config import run_config
from launcher.config.run_config import RunConfig
from launcher.errors import UserError
from roformer.config import ConfigError, RoFormerConfig

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
"""Where transformers' save_pretrained puts the weights, in the order roformer.hf_interop reads them."""


def load_run_config(path: str | os.PathLike, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """The run config (launcher.config.run_config.load_run_config) with the model section of its init_from
    directory read from DIR: what the launch plan, `roformer plan` and every rank load."""
    return run_config.load_run_config(path, overrides, read_init_model=read_init_model)


def read_init_model(init_dir: str, source: str, explicit: dict | None = None) -> tuple[dict, Path, tuple[str, ...]]:
    """DIR's model fields from its config.json, that file, and the weight fields the run may change (a BERT's
    position_encoding); UserError naming what is missing or wrong. `explicit`: the run config's model keys."""
    from roformer.hf_interop import config_from_hf  # imports torch: only when a run continues a model

    config_path = check_init_dir(init_dir, source) / "config.json"
    try:
        raw = json.loads(config_path.read_text(encoding="utf-8"))
    except ValueError as err:  # JSONDecodeError is a ValueError
        raise UserError(f"{config_path}: not a transformers RoFormer config ({err})") from None
    if isinstance(raw, dict) and raw.get("model_type") == "bert":
        return bert_base_config(raw, explicit, source, config_path).to_dict(), config_path, ("position_encoding",)
    try:
        return config_from_hf(raw, source=str(config_path)).to_dict(), config_path, ()
    except ConfigError as err:
        raise UserError(f"{config_path}: not a transformers RoFormer config ({err})") from None


def bert_base_config(raw: dict, explicit: dict | None, source: str, config_path: Path) -> RoFormerConfig:
    """A BERT source's model: RoPE in place of its table unless the run asks for `learned` (roformer/bert_interop.py)."""
    from roformer.bert_interop import config_from_bert

    encoding = (explicit or {}).get("position_encoding", "rope")
    try:
        return config_from_bert(raw, encoding, source=str(config_path))
    except ConfigError as err:
        raise UserError(f"{source}: init_from: {err}") from None


def init_source_note(init_dir: str, model: RoFormerConfig) -> str | None:
    """The start-up line of a BERT source: what it is continued as (None for a RoFormer source)."""
    try:
        raw = json.loads((Path(init_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict) or raw.get("model_type") != "bert":
        return None
    if model.position_encoding == "rope":
        return (f"init_from {init_dir} is a BERT: continued as RoPE (the default for a BERT), its absolute position table of "
                f"{raw.get('max_position_embeddings', 512)} rows dropped; model.position_encoding: learned keeps it")
    return (f"init_from {init_dir} is a BERT: continued as it is (model.position_encoding: learned, "
            f"{model.max_position_embeddings} positions)")


def check_init_dir(init_dir: str, source: str) -> Path:
    """DIR exists and holds config.json and weights (UserError naming what is missing)."""
    directory = Path(init_dir)
    if not directory.is_dir():
        raise UserError(f"{source}: init_from: {directory} is not a directory")
    if not (directory / "config.json").is_file():
        raise UserError(f"{source}: init_from: {directory}/config.json missing (not a transformers model directory)")
    weights = weights_file(directory)
    if weights is None:
        raise UserError(f"{source}: init_from: {directory} has no weights ({', '.join(WEIGHT_FILES)})")
    for file in safetensors_files(weights):
        check_safetensors_header(file, f"{source}: init_from")
    return directory


def safetensors_files(weights: Path) -> list[Path]:
    """The safetensors files behind `weights`: itself, or the shards its index names (none for pytorch_model.bin)."""
    if weights.name.endswith(".safetensors"):
        return [weights]
    if not weights.name.endswith(".safetensors.index.json"):
        return []
    try:
        shards = json.loads(weights.read_text(encoding="utf-8"))["weight_map"].values()
    except (OSError, ValueError, KeyError, AttributeError, TypeError) as err:
        raise UserError(f"{weights}: not a safetensors index (a JSON mapping with 'weight_map'): {err}") from None
    return [weights.parent / str(name) for name in sorted(set(shards))]


def check_safetensors_header(file: Path, where: str) -> None:
    """A safetensors file's header and its size against the tensors it lists, without reading the data
    (safe_open maps the file): a truncated copy is one line here instead of every rank's traceback."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(file), framework="pt"):
            pass
    except FileNotFoundError:
        raise UserError(f"{where}: {file} missing (named by the weights index)") from None
    except (SafetensorError, OSError, ValueError) as err:
        raise UserError(f"{where}: {file}: not a complete safetensors file (truncated or damaged: "
                        f"{str(err).removeprefix('Error while deserializing header: ')}); copy it again") from None


def weights_file(directory: Path) -> Path | None:
    """The file the weights are read from (a sharded checkpoint: its index), None when there is none."""
    return next((directory / name for name in WEIGHT_FILES if (directory / name).is_file()), None)


def init_tokenizer_sha256(directory: Path) -> tuple[Path, str] | None:
    """(file, fingerprint) of DIR's tokenizer, None when DIR has none."""
    from data_pipeline.errors import DataError
    from data_pipeline.tokenizer import resolve_model_path, tokenizer_hash

    try:
        path = resolve_model_path(directory)
    except DataError:
        return None
    return path, tokenizer_hash(path)


def check_init_tokenizer(init_dir: str, corpus, source: str) -> str | None:
    """UserError when the data was tokenized with another tokenizer than DIR's; a note (returned)
    when DIR has no tokenizer to compare with (then only model.vocab_size is checked)."""
    found = init_tokenizer_sha256(Path(init_dir))
    manifest = corpus.data_dir / "manifest.json"
    if found is None:
        return (f"init_from {init_dir} has no tokenizer (spm.model / tokenizer.json / vocab.txt): cannot check that "
                f"{corpus.data_dir} was tokenized with the model's vocabulary, only its size")
    path, sha = found
    if sha != corpus.tokenizer_sha256:
        raise UserError(f"{source}: data.data_dir {corpus.data_dir} was tokenized with tokenizer "
                        f"{corpus.tokenizer_sha256[:12]} ({manifest}), not init_from's {path} ({sha[:12]}): prepare "
                        f"it with `roformer data prepare --tokenizer {init_dir} ...`")
    return None

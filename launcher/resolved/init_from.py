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
from dataclasses import dataclass
from pathlib import Path

from data_pipeline.errors import DataError
from data_pipeline.tokenizer import resolve_model_path, tokenizer_hash
from launcher.config import run_config
from launcher.config.run_config import RunConfig
from launcher.common.errors import UserError
from roformer.config import ConfigError, RoFormerConfig
from roformer.hf_interop import PretrainedDir, read_pretrained
from roformer.hf_keys import WEIGHT_FILES

@dataclass(frozen=True)
class InitSource:
    """An init_from directory, read once when the run config is loaded (`load_config_and_init`): its config.json,
    BERT or RoFormer decided there (roformer.hf_interop.read_pretrained), the model section it gives the run,
    and its tokenizer's fingerprint. The checks, the start-up note, the initial weights (launcher/train/
    init_weights.py) and RUN_DIR/init_from.json all read this, never DIR's config.json again."""

    pretrained: PretrainedDir
    model: RoFormerConfig
    """DIR's model config, parsed once here (a BERT's continued with the position_encoding of the run config's
    model section, RoPE by default): the run's model section is laid over it, and the rank's weights are read
    for it (launcher/train/init_weights.py), so the encoding comes from one place."""
    weight_fields: tuple[str, ...]
    """The model fields the run may set differently from DIR's (a BERT's position_encoding)."""
    tokenizer: tuple[Path, str] | None
    """(file, sha256) of DIR's tokenizer; None when DIR has none."""

    @property
    def directory(self) -> Path:
        return self.pretrained.directory

    @property
    def model_fields(self) -> dict:
        """DIR's model fields, under which the run config's own `model:` keys go (run_config.model_over_init)."""
        return self.model.to_dict()


def load_config_and_init(path: str | os.PathLike, overrides: list[str] | tuple[str, ...] = ()
                         ) -> tuple[RunConfig, InitSource | None]:
    """The run config (launcher.config.run_config.load_run_config) with the model section of its init_from
    directory, and that directory as read (None without init_from): what the launch plan, `roformer plan` and
    every rank load."""
    read: list[InitSource] = []

    def read_init_model(init_dir: str, source: str, explicit: dict | None) -> tuple[dict, Path, tuple[str, ...]]:
        read.append(read_init_source(init_dir, source, explicit))
        return read[0].model_fields, read[0].pretrained.config_path, read[0].weight_fields

    cfg = run_config.load_run_config(path, overrides, read_init_model=read_init_model)
    return cfg, (read[0] if read else None)


def load_run_config(path: str | os.PathLike, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """The run config alone (`load_config_and_init`), for what does not start from its init_from directory."""
    return load_config_and_init(path, overrides)[0]


def read_init_source(init_dir: str, source: str, explicit: dict | None = None) -> InitSource:
    """DIR read once; UserError naming what is missing or wrong. `explicit`: the run config's model keys
    (a BERT is continued with their position_encoding, RoPE by default)."""
    directory = check_init_dir(init_dir, source)
    try:
        pretrained = read_pretrained(directory)
    except ConfigError as err:
        raise UserError(f"{source}: init_from: {err}") from None
    check_weight_family(pretrained, f"{source}: init_from")
    if pretrained.is_bert:
        encoding = (explicit or {}).get("position_encoding", "rope")
        try:
            model = pretrained.config(encoding)
        except ConfigError as err:
            raise UserError(f"{source}: init_from: {err}") from None
        return InitSource(pretrained, model, ("position_encoding",), init_tokenizer_sha256(directory))
    try:
        model = pretrained.config()
    except ConfigError as err:
        raise UserError(f"{pretrained.config_path}: not a transformers RoFormer config ({err})") from None
    return InitSource(pretrained, model, (), init_tokenizer_sha256(directory))


FAMILY_PREFIXES = {"bert": "bert.", "roformer": "roformer."}
"""The tensor-name prefix of each model_type's transformers checkpoint (a bare encoder's names have none)."""


def check_weight_family(pretrained: PretrainedDir, where: str) -> None:
    """config.json's model_type against the tensor names in the safetensors headers (names only, no data): a
    BERT's config.json over RoFormer weights (or the reverse) is refused here, at load, instead of by every rank
    after the run directory exists. pytorch_model.bin has no header to read: the rank's load checks it."""
    from safetensors import safe_open

    if pretrained.raw.get("model_type") not in FAMILY_PREFIXES:
        return  # another model_type: the config's parse names it (RoFormer-DS reads two)
    other = "roformer" if pretrained.is_bert else "bert"
    weights = weights_file(pretrained.directory)
    for file in safetensors_files(weights) if weights is not None else []:
        with safe_open(str(file), framework="pt") as handle:
            foreign = sorted(key for key in handle.keys() if key.startswith(FAMILY_PREFIXES[other]))
        if foreign:
            raise UserError(f"{where}: {pretrained.config_path} says model_type {pretrained.raw.get('model_type')!r}, "
                            f"but {file} holds {other} tensors ({foreign[0]}, ... {len(foreign)} in all): the "
                            f"config.json does not belong to these weights")


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
    try:
        path = resolve_model_path(directory)
    except DataError:
        return None
    return path, tokenizer_hash(path)

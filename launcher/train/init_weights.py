"""The weights a fresh run starts from when its config has `init_from` (launcher/resolved/init_from.py).

Every rank reads DIR's weights (its config.json was read once, with the run config: launcher/resolved/init_from.py
InitSource; a BERT's through roformer/bert_interop.py) and loads them before deepspeed.initialize, which then partitions the loaded values (any ZeRO stage). A directory
without an MLM head keeps the model's own head, initialised from the run's seed. Only a fresh start loads;
rank 0 records where the run started (init_from.json).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from launcher.config.run_config import WEIGHT_FIELDS
from launcher.common.errors import UserError
from launcher.resolved.init_from import InitSource, weights_file
from launcher.common.io import file_sha256
from roformer.bert_interop import mlm_head_names
from roformer.config import ConfigError
from roformer.hf_interop import load_mlm_weights


@dataclass
class InitialWeights:
    """DIR's weights, read once per rank, and what the run records about them."""

    directory: Path
    tensors: dict = field(repr=False)
    """transformers-named tensors (read_hf_directory)."""
    architectures: list
    """config.json's `architectures` (e.g. ['RoFormerForMaskedLM'], ['RoFormerModel'])."""
    model_type: str = "roformer"
    """config.json's model_type: 'roformer' or 'bert'."""
    dropped: list = field(default_factory=list)
    """DIR's tensors the model has no place for (a BERT's position table under RoPE, its pooler, NSP head)."""
    new_head: bool = False
    """Set by load_into: DIR had no MLM head, the model's own (seeded) one was kept."""
    tokenizer: tuple[Path, str] | None = None
    """(file, sha256) of DIR's tokenizer as the start-up read it (InitSource), None when DIR has none."""

    @classmethod
    def read(cls, init: InitSource, model_config) -> InitialWeights:
        """DIR's weights for the run's model (DIR's config as the run config's load parsed it: `init.model`, no
        second parse); UserError when they do not fit, or when a tensor holds NaN or inf (a damaged copy, refused
        here rather than by the numerics guard after the first step)."""
        config = init.model
        try:
            tensors, dropped = init.pretrained.weights(config)
        except ConfigError as err:
            raise UserError(f"init_from: {err}") from None
        refuse_non_finite(tensors, weights_file(init.directory))
        changed = [name for name in WEIGHT_FIELDS if getattr(config, name) != getattr(model_config, name)]
        if changed:
            raise UserError(f"init_from {init.pretrained.config_path}: {', '.join(changed)} differ from the run's "
                            f"model section ({', '.join(f'{n}={getattr(model_config, n)!r}' for n in changed)})")
        raw = init.pretrained.raw
        return cls(init.directory, tensors, list(raw.get("architectures") or []),
                   model_type=str(raw.get("model_type")), dropped=dropped, tokenizer=init.tokenizer)

    def load_into(self, model) -> bool:
        """Load into `model`; True (also kept in `new_head`) when its MLM head is new (DIR had none)."""
        try:
            self.new_head = load_mlm_weights(model, self.tensors, self.directory)
        except ConfigError as err:
            raise UserError(f"init_from: {err}") from None
        return self.new_head

    def record(self) -> dict:
        """The run's record of where it started: path, weights file and its sha256, tokenizer fingerprint."""
        weights = weights_file(self.directory)
        tokenizer = self.tokenizer
        return asdict(InitRecord(
            path=str(self.directory.resolve()), weights_file=weights.name, weights_sha256=file_sha256(weights),
            architectures=self.architectures, mlm_head="new" if self.new_head else "loaded",
            model_type=self.model_type, dropped=list(self.dropped), fresh=mlm_head_names(self.tensors),
            tokenizer_sha256=tokenizer[1] if tokenizer else None, recorded_at=time.strftime("%Y-%m-%dT%H:%M:%S%z")))


def refuse_non_finite(tensors: dict, weights: Path) -> None:
    """UserError naming the first floating tensor of `tensors` that holds NaN or inf, and how many values do."""
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise UserError(f"init_from {weights}: tensor {name} holds {bad:,} NaN or inf value(s) of "
                            f"{tensor.numel():,}: the weights are damaged (copy or export them again)")


@dataclass
class InitRecord:
    """RUN_DIR/init_from.json."""

    path: str
    """The directory the weights came from (absolute)."""
    weights_file: str
    """Its weights file: model.safetensors, model.safetensors.index.json (sharded) or pytorch_model.bin."""
    weights_sha256: str
    """sha256 of that file at the start of the run."""
    architectures: list
    """config.json's architectures of DIR."""
    mlm_head: str
    """'loaded' from DIR, or 'new' (DIR was a bare encoder: the head started from the run's seed)."""
    tokenizer_sha256: str | None
    """Fingerprint of DIR's tokenizer (the data's, checked at start-up); None when DIR had none."""
    recorded_at: str = ""
    model_type: str = "roformer"
    """DIR's config.json model_type: 'roformer' or 'bert' (records written before BERT sources have none)."""
    dropped: list = field(default_factory=list)
    """DIR's tensors not loaded (transformers' names): a BERT's position table under RoPE, pooler, NSP head."""
    fresh: list = field(default_factory=list)
    """Tensors the run initialised from its seed (transformers' names): the MLM head of a bare encoder."""

"""RoFormer (arXiv 2104.09864) in pure PyTorch: config, RoPE, attention, models, transformers interop.

Importing this package never imports DeepSpeed or torch.distributed. Its exports are loaded when first
named (PEP 562), so `roformer.config` (what the launcher's config layer validates with) imports no torch.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "config": ("ConfigError", "RoFormerConfig"),
    "hf_interop": ("config_from_hf", "config_to_hf", "from_hf_state_dict", "load_classifier_from_pretrained",
                   "load_pretrained", "save_pretrained", "to_hf_state_dict", "write_pretrained_files"),
    "model": ("IGNORE_INDEX", "MaskedLMOutput", "RoFormerForMaskedLM", "RoFormerForSequenceClassification",
              "RoFormerModel", "SequenceClassifierOutput"),
    "rope": ("RotaryEmbedding", "apply_rotary"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = list(_MODULE_OF)


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'roformer' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # the next lookup does not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

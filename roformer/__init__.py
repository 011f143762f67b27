"""RoFormer (arXiv 2104.09864) in pure PyTorch: config, RoPE, attention, models, transformers interop.

Importing this package never imports DeepSpeed or torch.distributed.
"""

from .config import ConfigError, RoFormerConfig
from .hf_interop import (
    config_from_hf,
    config_to_hf,
    from_hf_state_dict,
    load_classifier_from_pretrained,
    load_pretrained,
    save_pretrained,
    to_hf_state_dict,
    write_pretrained_files,
)
from .model import (
    IGNORE_INDEX,
    MaskedLMOutput,
    RoFormerForMaskedLM,
    RoFormerForSequenceClassification,
    RoFormerModel,
    SequenceClassifierOutput,
)
from .rope import RotaryEmbedding, apply_rotary

__all__ = [
    "ConfigError", "RoFormerConfig", "RoFormerModel", "RoFormerForMaskedLM", "RoFormerForSequenceClassification",
    "MaskedLMOutput", "SequenceClassifierOutput", "IGNORE_INDEX", "RotaryEmbedding",
    "apply_rotary", "save_pretrained", "write_pretrained_files", "load_pretrained",
    "load_classifier_from_pretrained", "to_hf_state_dict", "from_hf_state_dict", "config_to_hf", "config_from_hf",
]

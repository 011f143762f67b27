"""Model arithmetic from the config alone: matmul FLOPs of a step and parameter counts.

One formula for the trainer's MFU, the planner's estimates and the benchmarks (its conventions:
docs/model.md). Matmuls only, 2 FLOPs per multiply-add. With N = B * T tokens, h = hidden_size,
I = intermediate_size, E = embedding_size, L = num_hidden_layers, V = vocab_size, D = head_size and
M = masked tokens, one forward pass is

    embedding projection  2 N E h                      (only when E != h)
    per layer, L times:
      q, k, v, output     8 N h^2
      feed-forward        4 N h I
      attention           4 B T^2 h                    softmax: Q K^T and P V over every head
                          4 N h D + 2 N h              linear (eq. 19): K^T V, Q (K^T V), Q . sum_n K
    MLM head at M masked  2 M h E + 2 M E V            dense transform + tied decoder

and a training step is 3x the forward.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import RoFormerConfig

# Backward = 2x forward per matmul (input gradient + weight gradient), so a training step is 3x.
TRAINING_TO_FORWARD = 3


@dataclass(frozen=True)
class ForwardFlops:
    """Matmul FLOPs of one forward pass of the MLM model, by part (see the module docstring)."""

    embedding_projection: float
    """2 N E h when the factorized embeddings are projected up to the hidden size, else 0."""
    projections: float
    """q/k/v/output projections of all layers: L * 8 N h^2."""
    attention: float
    """Token mixing of all layers: L * 4 B T^2 h (softmax) or L * (4 N h D + 2 N h) (linear)."""
    feed_forward: float
    """Both feed-forward matmuls of all layers: L * 4 N h I."""
    mlm_head: float
    """Dense transform and tied decoder at the masked positions only: 2 M h E + 2 M E V."""

    @property
    def encoder(self) -> float:
        """Everything but the MLM head (what activation checkpointing recomputes)."""
        return self.embedding_projection + self.projections + self.attention + self.feed_forward

    @property
    def total(self) -> float:
        return self.encoder + self.mlm_head


def _require_shape(batch_size: int, seq_len: int, num_masked: float) -> None:
    if batch_size < 1 or seq_len < 1:
        raise ValueError(f"batch_size and seq_len must be >= 1, got {batch_size} x {seq_len}")
    if not 0 <= num_masked <= batch_size * seq_len:
        raise ValueError(f"num_masked: must be in [0, {batch_size * seq_len}] for a {batch_size} x {seq_len} "
                         f"batch, got {num_masked}")


def forward_flops(config: RoFormerConfig, batch_size: int, seq_len: int, num_masked: float) -> ForwardFlops:
    """Matmul FLOPs of one MLM forward over a (batch_size, seq_len) batch with num_masked labels.

    num_masked may be fractional (an expected count, e.g. mask_rate * tokens, for planning).
    """
    _require_shape(batch_size, seq_len, num_masked)
    tokens = batch_size * seq_len
    hidden, embedding, layers = config.hidden_size, config.embedding_size, config.num_hidden_layers
    if config.attention == "softmax":
        attention = 4.0 * batch_size * seq_len * seq_len * hidden
    else:
        attention = 4.0 * tokens * hidden * config.head_size + 2.0 * tokens * hidden
    return ForwardFlops(
        embedding_projection=2.0 * tokens * embedding * hidden if embedding != hidden else 0.0,
        projections=layers * 8.0 * tokens * hidden * hidden,
        attention=layers * attention,
        feed_forward=layers * 4.0 * tokens * hidden * config.intermediate_size,
        mlm_head=2.0 * num_masked * hidden * embedding + 2.0 * num_masked * embedding * config.vocab_size,
    )


def training_flops(config: RoFormerConfig, batch_size: int, seq_len: int, num_masked: float) -> float:
    """Model FLOPs of one training step (forward + backward) on one micro-batch: the MFU numerator."""
    return TRAINING_TO_FORWARD * forward_flops(config, batch_size, seq_len, num_masked).total


def hardware_training_flops(config: RoFormerConfig, batch_size: int, seq_len: int, num_masked: float,
                            activation_checkpointing: bool) -> float:
    """FLOPs actually executed by a training step: with activation checkpointing the encoder's forward
    runs twice (once more inside backward). Use for time estimates, not for MFU."""
    counts = forward_flops(config, batch_size, seq_len, num_masked)
    recompute = counts.encoder if activation_checkpointing else 0.0
    return TRAINING_TO_FORWARD * counts.total + recompute


def parameter_count(config: RoFormerConfig, head: str = "mlm", num_labels: int = 2) -> int:
    """Number of parameters of RoFormerForMaskedLM (head='mlm'; the decoder is tied to the word
    embeddings) or RoFormerForSequenceClassification (head='classification'), from the config alone.

    Lets the planner size model states (weights, gradients, optimizer moments) without a model.
    """
    hidden, embedding, inner = config.hidden_size, config.embedding_size, config.intermediate_size
    count = (config.vocab_size + config.type_vocab_size) * embedding + 2 * embedding  # tables + LayerNorm
    if config.position_encoding == "learned":
        count += config.max_position_embeddings * embedding
    if embedding != hidden:
        count += embedding * hidden + hidden
    per_layer = 4 * (hidden * hidden + hidden) + (hidden * inner + inner) + (inner * hidden + hidden) + 2 * 2 * hidden
    count += config.num_hidden_layers * per_layer
    if head == "mlm":
        return count + hidden * embedding + embedding + 2 * embedding + config.vocab_size
    if head == "classification":
        return count + hidden * hidden + hidden + hidden * num_labels + num_labels
    raise ValueError(f"head: must be 'mlm' or 'classification', got {head!r}")


__all__ = ["ForwardFlops", "forward_flops", "training_flops", "hardware_training_flops", "parameter_count",
           "TRAINING_TO_FORWARD"]

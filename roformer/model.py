"""The RoFormer encoder and its heads, in dependency order.

Embeddings -> post-LN blocks (as transformers' RoFormer / BERT) -> encoder -> MLM head (tied to the
word embeddings) and sequence-classification head. Pure PyTorch: tensors stay on their input's device;
the ops imported from `cpu_kernels` pick their kernel by that device (docs/model.md).
Shapes: B batch, T sequence length, E embedding size, H hidden size, I intermediate size, D head size,
V vocabulary, M masked tokens, K slots of masked positions per sequence (the data pipeline's `masked_positions`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .activations import ACTIVATION_FUNCTIONS
from .attention import SelfAttention, document_mask
from .config import SINUSOIDAL_ENCODINGS, ConfigError, RoFormerConfig
from .cpu_kernels import (decoder_cross_entropy, drop_padding_free_mask, drop_single_document, drop_unscored_rows,
                          dropout_add, feed_forward)
from .rope import RotaryEmbedding

IGNORE_INDEX = -100  # label value of unmasked positions (the data pipeline's and transformers' convention)
NO_POSITION = -1  # padding slot of `masked_positions` (data_pipeline.masking.NO_POSITION)


def masked_positions_from_labels(labels: torch.Tensor) -> torch.Tensor:
    """(B, T) labels -> (B, T) long: each row's labelled positions ascending, then NO_POSITION.

    For callers that pass labels only (transformers' API): a stable sort keeps the shape static (the
    data pipeline's narrower `masked_positions` saves the head T - K rows per sequence off the CPU).
    """
    is_masked = labels != IGNORE_INDEX  # (B, T)
    order = torch.argsort((~is_masked).to(torch.uint8), dim=1, stable=True)  # masked positions first, ascending
    return torch.where(is_masked.gather(1, order), order, NO_POSITION)


def sinusoidal_position_table(num_positions: int, size: int) -> torch.Tensor:
    """Vaswani et al.'s absolute encoding: PE[p, 2i] = sin(p w_i), PE[p, 2i+1] = cos(p w_i). (P, size)."""
    frequencies = 10000.0 ** (-torch.arange(0, size, 2, dtype=torch.float64) / size)
    angles = torch.outer(torch.arange(num_positions, dtype=torch.float64), frequencies)  # (P, size/2)
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2).to(torch.float32)


class Dropout(nn.Module):
    """nn.Dropout that can add a residual in the same pass: forward(x, residual) = residual + dropout(x)."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        return dropout_add(residual, x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


# ----------------------------------------------------------------------------------------------- embeddings
class Embeddings(nn.Module):
    """word + token type (+ absolute position for the baselines) -> LayerNorm -> dropout -> project to H."""

    def __init__(self, config: RoFormerConfig):
        super().__init__()
        self.position_encoding = config.position_encoding
        self.max_positions = config.max_position_embeddings
        self.word = nn.Embedding(config.vocab_size, config.embedding_size, padding_idx=config.pad_token_id)
        self.token_type = nn.Embedding(config.type_vocab_size, config.embedding_size)
        if config.position_encoding == "learned":
            self.position = nn.Embedding(config.max_position_embeddings, config.embedding_size)
        elif config.position_encoding in SINUSOIDAL_ENCODINGS:
            table = sinusoidal_position_table(config.max_position_embeddings, config.embedding_size)
            self.register_buffer("position_table", table, persistent=False)
        # Vaswani et al. (sec. 3.4) multiply the token embeddings by sqrt(d_model) before adding the
        # fixed table (RMS 1/sqrt(2)); without it, word embeddings initialised with std 0.02 are
        # drowned by the table. 'sinusoidal_unscaled' keeps the plain sum (a baseline of its own).
        self.word_scale = (math.sqrt(config.embedding_size) if config.position_encoding == "sinusoidal" else 1.0)
        self.norm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)
        # Factorized embeddings (ALBERT-style, as transformers' RoFormer): E may be smaller than H.
        self.project = (nn.Linear(config.embedding_size, config.hidden_size)
                        if config.embedding_size != config.hidden_size else None)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """position_ids (B, T), each < T: absolute positions per token (restarting per document); None = 0 .. T-1."""
        length = input_ids.shape[1]
        if token_type_ids is None:
            # Every token has type 0: add that one row, broadcast, instead of gathering it B*T times
            # (and scattering B*T gradient rows back into it). Called through the module so that
            # ZeRO-3 gathers the weight as for any lookup.
            token_type_ids = torch.zeros(1, 1, dtype=torch.long, device=input_ids.device)
        words = self.word(input_ids)
        if self.word_scale != 1.0:
            words = words * self.word_scale
        embedded = words + self.token_type(token_type_ids)  # (B, T, E)
        if self.position_encoding != "rope":
            if length > self.max_positions:
                raise ConfigError(f"max_position_embeddings: sequence length {length} exceeds the "
                                  f"{self.max_positions} positions of this '{self.position_encoding}' model")
            table = self.position.weight if self.position_encoding == "learned" else self.position_table
            # (T, E) broadcast over B, or (B, T, E) per token
            positions = table[:length] if position_ids is None else F.embedding(position_ids, table[:length])
            embedded = embedded + positions.to(embedded.dtype)
        embedded = self.dropout(self.norm(embedded))
        return embedded if self.project is None else self.project(embedded)  # (B, T, H)


# ----------------------------------------------------------------------------------------------- blocks
class Block(nn.Module):
    """Post-LN transformer block: h = LN(h + attn(h)); h = LN(h + ffn(h))."""

    def __init__(self, config: RoFormerConfig):
        super().__init__()
        self.attention = SelfAttention(config)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.ffn_in = nn.Linear(config.hidden_size, config.intermediate_size)
        self.ffn_out = nn.Linear(config.intermediate_size, config.hidden_size)
        self.ffn_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.activation = ACTIVATION_FUNCTIONS[config.hidden_act]
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None,
                rotary: tuple[torch.Tensor, torch.Tensor] | None, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        attended = self.attention(hidden, attention_mask, rotary, cu_seqlens)  # (B, T, H)
        hidden = self.attention_norm(self.dropout(attended, residual=hidden))  # (B, T, H)
        transformed = feed_forward(hidden, self.ffn_in, self.activation, self.ffn_out)  # (B, T, I) -> (B, T, H)
        return self.ffn_norm(self.dropout(transformed, residual=hidden))  # (B, T, H)


# ----------------------------------------------------------------------------------------------- encoder
class RoFormerModel(nn.Module):
    """Embeddings + blocks; returns the last hidden states (B, T, H)."""

    def __init__(self, config: RoFormerConfig):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.rope = (RotaryEmbedding(config.head_size, config.rope_theta, config.rope_scaling,
                                     config.rope_scaling_factor)
                     if config.position_encoding == "rope" else None)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_hidden_layers))
        self.gradient_checkpointing = False

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, document_ids: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """document_ids (B, T): a token attends only to tokens of its own document (None: to the whole
        sequence); position_ids (B, T), each < T: per-token positions (None: 0 .. T-1). The data pipeline
        reads both off the packed sequence's [SEP]s (data_pipeline/documents.py). cu_seqlens (N+1,) int32, with
        document_ids: the same documents as offsets in the flattened batch, which lets CUDA run one
        variable-length FlashAttention call instead of a masked one (roformer/attention.py)."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (batch, seq_len), got shape {tuple(input_ids.shape)}")
        if cu_seqlens is not None and document_ids is None:
            raise ValueError("cu_seqlens: the documents' offsets come with their document_ids")
        hidden = self.embeddings(input_ids, token_type_ids, position_ids)  # (B, T, H)
        document_ids = drop_single_document(document_ids)  # (B, T); None when each row is one document on CPU
        if document_ids is None:
            attention_mask = drop_padding_free_mask(attention_mask)  # (B, T), 1 = real token; or None
        else:
            attention_mask = document_mask(document_ids, attention_mask)  # (B, 1, T, T) bool
        # (cos, sin) each (T, D) in fp32, shared by all layers, or (B, 1, T, D) per token; None without RoPE
        rotary = None
        if self.rope is not None:
            rotary = self.rope.cos_sin(input_ids.shape[1], input_ids.device)
            if position_ids is not None:
                rotary = tuple(F.embedding(position_ids, table)[:, None] for table in rotary)
        for layer in self.layers:
            if self.gradient_checkpointing and self.training:
                hidden = checkpoint(layer, hidden, attention_mask, rotary, cu_seqlens, use_reentrant=False)  # (B, T, H)
            else:
                hidden = layer(hidden, attention_mask, rotary, cu_seqlens)  # (B, T, H)
        return hidden


class PreTrainedBase(nn.Module):
    """Weight init as transformers' `_init_weights`, shared by the heads."""

    config: RoFormerConfig

    @torch.no_grad()
    def _init_module(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            module.weight.normal_(0.0, std)
            if module.bias is not None:
                module.bias.zero_()
        elif isinstance(module, nn.Embedding):
            module.weight.normal_(0.0, std)
            if module.padding_idx is not None:
                module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            module.weight.fill_(1.0)
            module.bias.zero_()

    def init_weights(self) -> None:
        self.apply(self._init_module)

    def enable_gradient_checkpointing(self, enabled: bool = True) -> None:
        """Recompute each block in backward instead of storing its activations (saves memory)."""
        self.roformer.gradient_checkpointing = enabled

    def compile_layers(self, **options) -> None:
        """Compile each encoder block in place with torch.compile(**options) (regional compilation, as torchtitan):
        one graph serves every block, the embeddings and heads stay eager, and the state dict keeps its keys.
        Traced code takes the plain torch ops, never the CPU kernels (`cpu_kernels.use_cpu_kernels`)."""
        for layer in self.roformer.layers:
            layer.compile(**options)


# ----------------------------------------------------------------------------------------------- MLM
@dataclass
class MaskedLMOutput:
    """With labels: logits at masked positions only, summed CE and counts, so that the trainer can average
    over all masked tokens of all micro-batches and ranks: (M, V) on CPU, one row per slot of the masked
    positions (B*K, V) elsewhere (a padding slot's row scores nothing). Without labels: logits (B, T, V)."""

    logit_parts: tuple[torch.Tensor, ...]
    """The logits as vocabulary slices (the CPU loss computes them slice by slice); `logits` joins them."""
    loss_sum: torch.Tensor | None = None  # fp32 scalar, sum of token cross-entropies
    num_masked: torch.Tensor | None = None  # long scalar
    num_correct: torch.Tensor | None = None  # long scalar, argmax == label

    @property
    def logits(self) -> torch.Tensor:
        """(M, V) or (B*K, V) with labels, (B, T, V) without; assembled on first access (the trainer never reads them)."""
        if len(self.logit_parts) != 1:
            self.logit_parts = (torch.cat(self.logit_parts, dim=-1),)
        return self.logit_parts[0]

    @property
    def loss(self) -> torch.Tensor | None:
        """Mean CE over this batch's masked tokens (0 when there are none)."""
        if self.loss_sum is None:
            return None
        return self.loss_sum / self.num_masked.clamp_min(1).to(self.loss_sum.dtype)


class MaskedLMHead(nn.Module):
    """dense (H -> E) + activation + LayerNorm, then the tied decoder E -> V plus an output bias."""

    def __init__(self, config: RoFormerConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.embedding_size)
        self.activation = ACTIVATION_FUNCTIONS[config.hidden_act]
        self.norm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden: torch.Tensor, word_embeddings: torch.Tensor, targets: torch.Tensor | None = None):
        """hidden (..., H), word_embeddings (V, E) -> logits (..., V); with targets (M,) for hidden (M, H):
        (logits (M, V) as vocabulary slices, fp32 summed cross-entropy, long count of argmax == target)."""
        transformed = self.norm(self.activation(self.dense(hidden)))  # (..., E)
        if targets is None:
            return F.linear(transformed, word_embeddings, self.bias)
        return decoder_cross_entropy(transformed, word_embeddings, self.bias, targets)


class RoFormerForMaskedLM(PreTrainedBase):
    def __init__(self, config: RoFormerConfig):
        super().__init__()
        self.config = config
        self.roformer = RoFormerModel(config)
        self.mlm_head = MaskedLMHead(config)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                masked_positions: torch.Tensor | None = None, document_ids: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None) -> MaskedLMOutput:
        """labels (B, T), -100 = not scored; masked_positions (B, K): the labelled positions of each row
        ascending, padded with -1 (the data pipeline's; None = derived from labels); document_ids,
        position_ids and cu_seqlens: see RoFormerModel.forward."""
        hidden = self.roformer(input_ids, attention_mask, token_type_ids, document_ids, position_ids,
                               cu_seqlens)  # (B, T, H)
        # (V, E), the tied decoder weight. Read here, outside its owning module: ZeRO-3 detects such
        # external accesses during the engine's forward and gathers the partitioned weight.
        word_embeddings = self.roformer.embeddings.word.weight
        if labels is None:
            return MaskedLMOutput(logit_parts=(self.mlm_head(hidden, word_embeddings),))  # (B, T, V)

        # Only masked positions need the V-wide projection: with ~15% masking and a 30k vocabulary this
        # is most of the head's time and memory. Gathered at fixed slots rather than by a boolean index:
        # the shapes are known before the data is, so the host never waits for the device.
        if masked_positions is None:
            masked_positions = masked_positions_from_labels(labels)
        filled = masked_positions != NO_POSITION  # (B, K)
        slots = masked_positions.clamp_min(0)  # (B, K), a padding slot reads position 0 and scores nothing
        targets = labels.gather(1, slots).masked_fill(~filled, IGNORE_INDEX).flatten()  # (B*K,)
        rows = hidden.gather(1, slots[..., None].expand(-1, -1, hidden.shape[-1])).flatten(0, 1)  # (B*K, H)
        rows, targets = drop_unscored_rows(rows, targets, IGNORE_INDEX)  # (M, H) on CPU
        logit_parts, loss_sum, num_correct = self.mlm_head(rows, word_embeddings, targets)  # (M or B*K, V)
        num_masked = (labels != IGNORE_INDEX).sum()
        return MaskedLMOutput(logit_parts=logit_parts, loss_sum=loss_sum, num_masked=num_masked,
                              num_correct=num_correct)


# ----------------------------------------------------------------------------------------------- classification
@dataclass
class SequenceClassifierOutput:
    logits: torch.Tensor  # (B, num_labels)
    loss: torch.Tensor | None = None  # mean CE (MSE when num_labels == 1, i.e. regression)


class ClassificationHead(nn.Module):
    """As transformers' RoFormerClassificationHead: [CLS] -> dropout -> dense -> act -> dropout -> out_proj."""

    def __init__(self, config: RoFormerConfig, num_labels: int):
        super().__init__()
        self.dropout = Dropout(config.hidden_dropout_prob)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = ACTIVATION_FUNCTIONS[config.hidden_act]
        self.out_proj = nn.Linear(config.hidden_size, num_labels)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        first_token = self.dropout(hidden[:, 0])  # (B, H), the [CLS] position
        return self.out_proj(self.dropout(self.activation(self.dense(first_token))))  # (B, num_labels)


class RoFormerForSequenceClassification(PreTrainedBase):
    def __init__(self, config: RoFormerConfig, num_labels: int = 2):
        super().__init__()
        if isinstance(num_labels, bool) or not isinstance(num_labels, int) or num_labels < 1:
            raise ConfigError(f"num_labels: must be an integer >= 1, got {num_labels!r}")
        self.config = config
        self.num_labels = num_labels
        self.roformer = RoFormerModel(config)
        self.classifier = ClassificationHead(config, num_labels)
        self.init_weights()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None,
                labels: torch.Tensor | None = None) -> SequenceClassifierOutput:
        logits = self.classifier(self.roformer(input_ids, attention_mask, token_type_ids))  # (B, num_labels)
        loss = None
        if labels is not None:
            if self.num_labels == 1:
                loss = F.mse_loss(logits.squeeze(-1).float(), labels.float())
            else:
                loss = F.cross_entropy(logits.float(), labels)
        return SequenceClassifierOutput(logits=logits, loss=loss)


__all__ = ["RoFormerModel", "RoFormerForMaskedLM", "RoFormerForSequenceClassification", "MaskedLMOutput",
           "SequenceClassifierOutput", "IGNORE_INDEX", "NO_POSITION",
           "masked_positions_from_labels", "Dropout", "sinusoidal_position_table"]

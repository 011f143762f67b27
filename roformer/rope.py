"""Rotary Position Embedding (RoPE), exactly as in the RoFormer paper (arXiv 2104.09864).

Pairs are interleaved: (x1, x2), (x3, x4), ... rotate by m * theta_i with
theta_i = base ** (-2(i-1)/d), i = 1..d/2. The rotation is applied with the element-wise form of
eq. 34, x * cos + rotate_every_two(x) * sin, never with a dense matrix. This is also the layout of
transformers' RoFormer (`apply_rotary_position_embeddings`), so weights are interchangeable.
"""

from __future__ import annotations

import math

import torch

# Tables grow in multiples of this many positions so a slowly increasing length does not rebuild
# the table on every step.
_GROWTH_QUANTUM = 256


def rotary_inverse_frequencies(head_size: int, base: float = 10000.0, scaling: str = "none",
                               factor: float = 1.0) -> torch.Tensor:
    """theta_i for i = 1..d/2 as float64, shape (d/2,), including the scaling variant."""
    if head_size % 2:
        raise ValueError(f"RoPE needs an even head size, got {head_size}")
    if scaling == "ntk":
        # NTK-aware scaling stretches the lowest frequency by `factor` and leaves the highest alone.
        base = base * factor ** (head_size / (head_size - 2))
    exponents = torch.arange(0, head_size, 2, dtype=torch.float64) / head_size  # 2(i-1)/d
    return base ** (-exponents)


def rotary_angles(positions: torch.Tensor, inverse_frequencies: torch.Tensor, scaling: str = "none",
                  factor: float = 1.0) -> torch.Tensor:
    """m * theta_i in float64, shape (len(positions), d/2)."""
    positions = positions.to(torch.float64)
    if scaling == "linear":
        positions = positions / factor  # position interpolation
    return torch.outer(positions, inverse_frequencies)


def rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2, x3, x4, ...) -> (-x2, x1, -x4, x3, ...) on the last dimension (eq. 34's second term)."""
    rotated = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1)  # (..., d/2, 2)
    return rotated.flatten(-2)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (..., T, d) by per-position cos/sin (T, d) in float32, then cast back to x's dtype.

    Computes eq. 34, x * cos + rotate_every_two(x) * sin, as one complex product per pair:
    (x_2i + i x_2i+1) * (cos m theta_i + i sin m theta_i) has real part x_2i cos - x_2i+1 sin and
    imaginary part x_2i+1 cos + x_2i sin, the same two terms; one pass instead of five (the stack
    in rotate_every_two copies), and autograd's backward is the product with the conjugate.
    The arithmetic is done in float32 so that positions stay exact when activations are fp16/bf16
    (a bf16 angle table cannot even tell position 4096 from 4097 apart). Under torch.compile the
    same eq. 34 in real arithmetic (the compiler fuses it; complex tensors would break the graph).
    """
    x32 = x.float()
    if torch.compiler.is_compiling():
        # Traced (run config `model.compile`): eq. 34 in real arithmetic, which the compiler fuses into one
        # kernel; the complex view below needs its alignment checked on strides, a graph break.
        return (x32 * cos + rotate_every_two(x32) * sin).to(x.dtype)
    if x32.stride(-1) != 1 or x32.storage_offset() % 2 or any(stride % 2 for stride in x32.stride()[:-1]):
        x32 = x32.contiguous()  # view_as_complex needs (real, imag) pairs adjacent and aligned
    pairs = torch.view_as_complex(x32.unflatten(-1, (-1, 2)))  # (..., T, d/2)
    rotation = torch.complex(cos[..., ::2], sin[..., ::2])  # (T, d/2); tables repeat each angle for its pair
    return torch.view_as_real(pairs * rotation).flatten(-2).to(x.dtype)


class RotaryEmbedding(torch.nn.Module):
    """Holds the cached cos/sin tables of one model; stateless as far as the state dict goes.

    The tables are plain attributes, not buffers, so `model.half()` (DeepSpeed fp16) can never
    turn them into half precision and `state_dict()` never carries them.
    """

    def __init__(self, head_size: int, base: float = 10000.0, scaling: str = "none", factor: float = 1.0):
        super().__init__()
        self.head_size = head_size
        self.base = base
        self.scaling = scaling
        self.factor = factor
        self.inverse_frequencies = rotary_inverse_frequencies(head_size, base, scaling, factor)  # float64
        # fp32 whatever the model's dtype: a bf16 table cannot tell position 4096 from 4097 apart.
        self._cos: torch.Tensor | None = None  # (T_cached, d) float32, each value repeated for its pair
        self._sin: torch.Tensor | None = None

    def set_base(self, base: float) -> None:
        """A new RoPE base (theta) for the same module: the inverse frequencies and the cached fp32
        tables are rebuilt exactly as a fresh RotaryEmbedding(head_size, base, ...) would build them
        (the schedule's per-stage rope_theta; the weights are not touched)."""
        if base == self.base:
            return
        self.base = float(base)
        self.inverse_frequencies = rotary_inverse_frequencies(self.head_size, self.base, self.scaling, self.factor)
        self._cos = self._sin = None

    @property
    def cached_length(self) -> int:
        return 0 if self._cos is None else self._cos.shape[0]

    def _build(self, length: int, device: torch.device) -> None:
        # Angles in float64 (as transformers computes them with numpy): m * theta_i for positions in
        # the thousands would lose digits in fp32 before the cos/sin.
        positions = torch.arange(length, dtype=torch.float64)
        angles = rotary_angles(positions, self.inverse_frequencies, self.scaling, self.factor)  # (T, d/2)
        angles = angles.repeat_interleave(2, dim=-1)  # (T, d): theta_1, theta_1, theta_2, theta_2, ...
        self._cos = angles.cos().to(device=device, dtype=torch.float32)
        self._sin = angles.sin().to(device=device, dtype=torch.float32)

    def cos_sin(self, seq_len: int, device: torch.device, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 tables for positions offset .. offset+seq_len-1, each (seq_len, d)."""
        needed = offset + seq_len
        # Grown lazily: the stage schedule raises the sequence length mid-run, and a RoPE model has no
        # maximum length to build for up front. Rebuilt on a new device (the model was moved).
        if self._cos is None or self._cos.device != torch.device(device) or needed > self.cached_length:
            length = max(needed, self.cached_length)
            self._build(math.ceil(length / _GROWTH_QUANTUM) * _GROWTH_QUANTUM, device)
        return self._cos[offset:needed], self._sin[offset:needed]

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """Rotate x (..., T, d) as if its T rows sat at positions offset .. offset+T-1."""
        cos, sin = self.cos_sin(x.shape[-2], x.device, offset)
        return apply_rotary(x, cos, sin)

    def extra_repr(self) -> str:
        return f"head_size={self.head_size}, base={self.base}, scaling={self.scaling}, factor={self.factor}"


def set_rope_theta(model: torch.nn.Module, theta: float) -> int:
    """Set every RotaryEmbedding inside `model` to base `theta`; returns how many there were."""
    found = [module for module in model.modules() if isinstance(module, RotaryEmbedding)]
    for module in found:
        module.set_base(theta)
    return len(found)


def transformers_sinusoidal_table(num_positions: int, head_size: int) -> torch.Tensor:
    """transformers' `RoFormerSinusoidalPositionalEmbedding` weight: [sin(m theta) | cos(m theta)].

    transformers stores this frozen table in its checkpoints, so an export must write it.
    """
    angles = rotary_angles(torch.arange(num_positions), rotary_inverse_frequencies(head_size))  # (P, d/2)
    return torch.cat((angles.sin(), angles.cos()), dim=-1).to(torch.float32)  # (P, d)


__all__ = ["RotaryEmbedding", "apply_rotary", "set_rope_theta", "rotate_every_two", "rotary_inverse_frequencies", "rotary_angles",
           "transformers_sinusoidal_table"]

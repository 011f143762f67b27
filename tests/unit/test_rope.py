"""RoPE against the paper (arXiv 2104.09864): eqs. 15, 16, 34 and the long-term decay of appendix C."""

import math

import pytest
import torch

from roformer.rope import (
    RotaryEmbedding,
    apply_rotary,
    rotary_inverse_frequencies,
    rotate_every_two,
)


def dense_rotation_matrix(position: int, head_size: int) -> torch.Tensor:
    """R^d_{Theta,m} of eq. 15, built entry by entry from the paper's definition (float64)."""
    matrix = torch.zeros(head_size, head_size, dtype=torch.float64)
    for i in range(1, head_size // 2 + 1):  # theta_i = 10000^(-2(i-1)/d)
        angle = position * 10000.0 ** (-2 * (i - 1) / head_size)
        row = 2 * (i - 1)
        matrix[row, row], matrix[row, row + 1] = math.cos(angle), -math.sin(angle)
        matrix[row + 1, row], matrix[row + 1, row + 1] = math.sin(angle), math.cos(angle)
    return matrix


def rotate_at(x: torch.Tensor, positions: list[int]) -> torch.Tensor:
    """Rotate row t of x (T, d) to positions[t] with the module under test."""
    rope = RotaryEmbedding(x.shape[-1])
    cos, sin = rope.cos_sin(max(positions) + 1, x.device)
    index = torch.tensor(positions)
    return apply_rotary(x, cos[index], sin[index])


def test_frequencies_follow_the_paper():
    d = 16
    expected = torch.tensor([10000.0 ** (-2 * (i - 1) / d) for i in range(1, d // 2 + 1)], dtype=torch.float64)
    torch.testing.assert_close(rotary_inverse_frequencies(d), expected, rtol=1e-15, atol=0)


def test_rotate_every_two_is_the_second_term_of_eq_34():
    x = torch.arange(1.0, 7.0)
    torch.testing.assert_close(rotate_every_two(x), torch.tensor([-2.0, 1.0, -4.0, 3.0, -6.0, 5.0]))


@pytest.mark.parametrize("position", [0, 1, 7, 300, 4096])
def test_element_wise_form_equals_block_diagonal_matrix_of_eq_15(position):
    torch.manual_seed(position)
    head_size = 32
    x = torch.randn(head_size, dtype=torch.float64)
    expected = dense_rotation_matrix(position, head_size) @ x
    got = rotate_at(x[None].float(), [position])[0].double()
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)


def test_scores_depend_only_on_relative_position_eq_16():
    torch.manual_seed(0)
    head_size, length = 64, 12
    query, key = torch.randn(length, head_size), torch.randn(length, head_size)
    positions = list(range(length))
    base_scores = rotate_at(query, positions) @ rotate_at(key, positions).T  # (T, T)
    for offset in (1, 37, 1000):
        shifted = [p + offset for p in positions]
        shifted_scores = rotate_at(query, shifted) @ rotate_at(key, shifted).T
        torch.testing.assert_close(shifted_scores, base_scores, atol=2e-4, rtol=1e-4)
    # and it does depend on the relative position (the test would pass trivially for the identity)
    moved_key = rotate_at(key, [p + 5 for p in positions])
    assert (rotate_at(query, positions) @ moved_key.T - base_scores).abs().max() > 1e-1


def test_rotation_preserves_norms():
    torch.manual_seed(1)
    x = torch.randn(2, 3, 50, 64, dtype=torch.float64)
    rotated = RotaryEmbedding(64)(x)
    torch.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1), atol=1e-6, rtol=1e-6)
    assert not torch.allclose(rotated[..., 1:, :], x[..., 1:, :])


def mean_abs_partial_sums(relative_distance: torch.Tensor, thetas: torch.Tensor) -> torch.Tensor:
    """(1 / (d/2)) sum_{j=1}^{d/2} |S_j| with S_j = sum_{i=0}^{j-1} e^{i (m-n) theta_i} (appendix C, eq. 37)."""
    phases = torch.polar(torch.ones(len(relative_distance), len(thetas), dtype=torch.float64),
                         torch.outer(relative_distance.double(), thetas))  # (R, d/2)
    return phases.cumsum(dim=1).abs().mean(dim=1)  # (R,)


def bucket_means(values: torch.Tensor, bucket: int) -> torch.Tensor:
    return values[: len(values) // bucket * bucket].view(-1, bucket).mean(dim=1)


def test_long_term_decay_bound_of_appendix_c():
    """Fig. 3: the bound decays with relative distance 0..256. It oscillates locally (as in the figure),
    so the check is: value at 0 is the maximum (d/2+1)/2, and means over 32-wide buckets strictly
    decrease, ending well below the start."""
    head_size = 128
    distances = torch.arange(0, 257)
    bound = mean_abs_partial_sums(distances, rotary_inverse_frequencies(head_size))
    assert bound[0].item() == pytest.approx((head_size / 2 + 1) / 2)
    assert bound.argmax().item() == 0
    buckets = bucket_means(bound, 32)  # 8 buckets over 0..255
    assert torch.all(buckets[1:] < buckets[:-1]), buckets
    assert buckets[-1] < 0.5 * buckets[0]
    # Control: without the geometric spread of frequencies there is no decay, and the check fails.
    flat = mean_abs_partial_sums(distances, torch.full((head_size // 2,), 2 * math.pi, dtype=torch.float64))
    flat_buckets = bucket_means(flat, 32)
    assert not torch.all(flat_buckets[1:] < flat_buckets[:-1])


def test_grown_cache_equals_fresh_cache():
    grown = RotaryEmbedding(32)
    grown.cos_sin(10, torch.device("cpu"))
    first_length = grown.cached_length
    cos_grown, sin_grown = grown.cos_sin(first_length + 700, torch.device("cpu"))
    assert grown.cached_length > first_length
    cos_fresh, sin_fresh = RotaryEmbedding(32).cos_sin(first_length + 700, torch.device("cpu"))
    assert torch.equal(cos_grown, cos_fresh) and torch.equal(sin_grown, sin_fresh)
    # the cache is float32 and carried by no state dict
    assert cos_grown.dtype == torch.float32 and len(grown.state_dict()) == 0


def test_cache_survives_module_half():
    rope = RotaryEmbedding(16)
    rope.cos_sin(8, torch.device("cpu"))
    rope.half()  # what DeepSpeed does to an fp16 model
    cos, _ = rope.cos_sin(8, torch.device("cpu"))
    assert cos.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_activations_rotate_as_float32_at_position_4096(dtype):
    torch.manual_seed(2)
    head_size, start, length = 64, 4096, 8
    x = torch.randn(1, 2, length, head_size).to(dtype)
    rope = RotaryEmbedding(head_size)
    got = rope(x, offset=start)
    assert got.dtype == dtype
    # exactly the float32 rotation of the same inputs, rounded once to `dtype`
    assert torch.equal(got, rope(x.float(), offset=start).to(dtype))
    # and within half an ulp (plus float32 noise) of the exact float64 rotation of eq. 15
    matrices = torch.stack([dense_rotation_matrix(start + t, head_size) for t in range(length)])  # (T, d, d)
    exact = torch.einsum("tij,bhtj->bhti", matrices, x.double())  # (1, 2, T, d)
    bound = 0.5 * torch.finfo(dtype).eps * exact.abs() + 1e-5
    assert torch.all((got.double() - exact).abs() <= bound)
    # Control: the same check fails for a rotation whose angles are computed in `dtype` itself.
    naive_angles = (torch.arange(start, start + length, dtype=dtype)[:, None]
                    * rotary_inverse_frequencies(head_size).to(dtype)).repeat_interleave(2, dim=-1)  # (T, d)
    naive = x * naive_angles.cos() + rotate_every_two(x) * naive_angles.sin()
    assert not torch.all((naive.double() - exact).abs() <= bound)


def test_scaling_variants():
    head_size, factor = 32, 4.0
    plain = RotaryEmbedding(head_size)
    linear = RotaryEmbedding(head_size, scaling="linear", factor=factor)
    ntk = RotaryEmbedding(head_size, scaling="ntk", factor=factor)
    cos_plain, _ = plain.cos_sin(401, torch.device("cpu"))
    cos_linear, _ = linear.cos_sin(401, torch.device("cpu"))
    # position interpolation: position 4p under linear scaling is position p without it
    torch.testing.assert_close(cos_linear[400], cos_plain[100])
    # NTK-aware: the highest frequency is unchanged, the lowest one is stretched by the factor
    torch.testing.assert_close(ntk.inverse_frequencies[0], plain.inverse_frequencies[0])
    torch.testing.assert_close(ntk.inverse_frequencies[-1], plain.inverse_frequencies[-1] / factor)

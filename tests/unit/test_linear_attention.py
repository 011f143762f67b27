"""Linear attention with RoPE (the paper's eq. 19) against a direct O(N^2) evaluation."""

import math

import pytest
import torch
import torch.nn.functional as F

from roformer.attention import linear_attention
from roformer.rope import RotaryEmbedding


def rotation_matrix(position: int, head_size: int) -> torch.Tensor:
    """Dense R^d_{Theta,m} of eq. 15 (float64)."""
    matrix = torch.zeros(head_size, head_size, dtype=torch.float64)
    for i in range(head_size // 2):
        angle = position * 10000.0 ** (-2 * i / head_size)
        matrix[2 * i:2 * i + 2, 2 * i:2 * i + 2] = torch.tensor(
            [[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]], dtype=torch.float64)
    return matrix


def eq19_direct(query, key, value, mask):
    """Attention_m = sum_n (R_m phi(q_m))^T (R_n phi(k_n)) v_n / sum_n phi(q_m)^T phi(k_n), n over real tokens."""
    batch, heads, length, head_size = query.shape
    phi = lambda x: F.elu(x.double()) + 1  # noqa: E731
    rotations = [rotation_matrix(p, head_size) for p in range(length)]
    out = torch.zeros(batch, heads, length, value.shape[-1], dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            for m in range(length):
                numerator = torch.zeros(value.shape[-1], dtype=torch.float64)
                denominator = torch.zeros((), dtype=torch.float64)
                q = phi(query[b, h, m])
                for n in range(length):
                    if mask is not None and mask[b, n] == 0:
                        continue
                    k = phi(key[b, h, n])
                    numerator += ((rotations[m] @ q) @ (rotations[n] @ k)) * value[b, h, n].double()
                    denominator += q @ k
                out[b, h, m] = numerator / denominator
    return out


@pytest.mark.parametrize("with_padding", [False, True])
def test_linear_attention_equals_direct_evaluation_of_eq_19(with_padding):
    torch.manual_seed(3)
    batch, heads, length, head_size = 2, 2, 7, 8
    query = torch.randn(batch, heads, length, head_size)
    key = torch.randn(batch, heads, length, head_size)
    value = torch.randn(batch, heads, length, head_size)
    mask = None
    if with_padding:
        mask = torch.ones(batch, length, dtype=torch.long)
        mask[1, 4:] = 0
    cos, sin = RotaryEmbedding(head_size).cos_sin(length, query.device)
    got = linear_attention(query, key, value, cos, sin, mask)
    expected = eq19_direct(query, key, value, mask)
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)


def test_padded_keys_do_not_leak_into_real_rows():
    torch.manual_seed(4)
    query, key, value = (torch.randn(1, 2, 6, 8) for _ in range(3))
    mask = torch.tensor([[1, 1, 1, 1, 0, 0]])
    cos, sin = RotaryEmbedding(8).cos_sin(6, query.device)
    base = linear_attention(query, key, value, cos, sin, mask)
    key2, value2 = key.clone(), value.clone()
    key2[..., 4:, :] += 100.0
    value2[..., 4:, :] -= 50.0
    changed = linear_attention(query, key2, value2, cos, sin, mask)
    torch.testing.assert_close(changed[..., :4, :], base[..., :4, :])


def test_without_rotation_it_is_plain_linear_attention():
    torch.manual_seed(5)
    query, key, value = (torch.randn(1, 1, 5, 4) for _ in range(3))
    phi_q, phi_k = F.elu(query) + 1, F.elu(key) + 1
    weights = phi_q @ phi_k.transpose(-1, -2)  # (1, 1, T, T)
    expected = (weights / weights.sum(-1, keepdim=True)) @ value
    torch.testing.assert_close(linear_attention(query, key, value, None, None, None), expected,
                               atol=1e-6, rtol=1e-5)

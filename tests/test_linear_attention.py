"""Linear attention with position (RoFormer's 3.3 form, Luo et al.'s Toeplitz weights by FFT)
against the dense equations, float64, causal and not, values and gradients."""

from __future__ import annotations

import pytest
import torch

from posenc_cli.kernels.linear_attention import (
    EPS,
    features,
    rotary_linear_attention,
    rotate_features,
    toeplitz_apply,
    toeplitz_linear_attention,
)

B, H, N, D, E = 2, 3, 11, 8, 5


def inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    make = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64, requires_grad=True)  # noqa: E731
    return make(B, H, N, D), make(B, H, N, D), make(B, H, N, E)


INV_FREQ = 10000 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)


def causal_mask(causal: bool) -> torch.Tensor:
    return torch.ones(N, N, dtype=torch.float64).tril() if causal else torch.ones(N, N)


def dense_rotary(q, k, v, positions, causal):
    fq, fk = features(q), features(k)
    rq, rk = rotate_features(fq, positions, INV_FREQ), rotate_features(fk, positions, INV_FREQ)
    mask = causal_mask(causal)
    numerator = (rq @ rk.transpose(-2, -1)) * mask
    denominator = ((fq @ fk.transpose(-2, -1)) * mask).sum(-1, keepdim=True)
    return numerator @ v / (denominator + EPS)


def check_with_gradients(fast, dense, tensors):
    a, b = fast(), dense()
    torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-9)
    w = torch.randn(a.shape, generator=torch.Generator().manual_seed(7), dtype=a.dtype)
    ga = torch.autograd.grad((a * w).sum(), tensors)
    gb = torch.autograd.grad((dense() * w).sum(), tensors)
    for x, y in zip(ga, gb, strict=True):
        torch.testing.assert_close(x, y, atol=1e-9, rtol=1e-8)


@pytest.mark.parametrize("causal", [False, True])
def test_rotary_linear_attention_is_roformers_equation(causal):
    q, k, v = inputs()
    pos = torch.arange(N) + 4
    check_with_gradients(
        lambda: rotary_linear_attention(q, k, v, pos, INV_FREQ, causal),
        lambda: dense_rotary(q, k, v, pos, causal),
        (q, k, v),
    )


def test_rotary_numerator_sees_relative_position_only():
    q, k, v = inputs(1)
    a = rotary_linear_attention(q, k, v, torch.arange(N), INV_FREQ, causal=True)
    b = rotary_linear_attention(q, k, v, torch.arange(N) + 1000, INV_FREQ, causal=True)
    torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)


def test_toeplitz_apply_is_the_matrix_product():
    weights = torch.randn(H, 2 * N - 1, dtype=torch.float64)
    x = torch.randn(B, H, N, 4, dtype=torch.float64)
    m, n = torch.arange(N)[:, None], torch.arange(N)[None, :]
    matrix = weights[:, m - n + N - 1]  # (H, N, N)
    torch.testing.assert_close(toeplitz_apply(weights, x), matrix @ x, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
def test_toeplitz_linear_attention_is_luos_equation(causal):
    q, k, v = inputs(2)
    offsets = torch.arange(-(N - 1), N, dtype=torch.float64)
    slopes = torch.tensor([0.5, 0.25, 0.125], dtype=torch.float64)[:, None]
    weights = torch.exp(-slopes * offsets.abs())  # ALiBi's bias, exponentiated: (H, 2N - 1)

    def dense():
        fq, fk = features(q), features(k)
        m, n = torch.arange(N)[:, None], torch.arange(N)[None, :]
        w = weights[:, m - n + N - 1] * causal_mask(causal)  # (H, N, N)
        scores = w * (fq @ fk.transpose(-2, -1))
        return scores @ v / (scores.sum(-1, keepdim=True) + EPS)

    check_with_gradients(
        lambda: toeplitz_linear_attention(q, k, v, weights, causal), dense, (q, k, v)
    )


def test_toeplitz_with_flat_weights_is_plain_linear_attention():
    q, k, v = inputs(3)
    flat = torch.ones(H, 2 * N - 1, dtype=torch.float64)
    fq, fk = features(q), features(k)
    plain = fq @ (fk.transpose(-2, -1) @ v) / (fq @ fk.sum(2, keepdim=True).transpose(-2, -1) + EPS)
    torch.testing.assert_close(toeplitz_linear_attention(q, k, v, flat), plain)

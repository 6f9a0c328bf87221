"""ALiBi on the flash kernel without an (N, N) bias (kernels/slope_bias.py) against the dense
equation."""

from __future__ import annotations

import math

import pytest
import torch

from posenc_cli.encodings import build_encoding
from posenc_cli.encodings.alibi import slopes
from posenc_cli.kernels import slope_bias
from posenc_cli.models.attention import Attention


def dense_alibi(q, k, v, m, scale, causal):
    """softmax(q k^T scale - m_h |i - j|) v, the paper's equation written out."""
    i = torch.arange(q.shape[-2])
    distance = (i[:, None] - i[None, :]).abs().to(q.dtype)
    scores = q @ k.transpose(-1, -2) * scale - m.to(q.dtype)[:, None, None] * distance
    if causal:
        scores = scores.masked_fill(i[None, :] > i[:, None], -math.inf)
    return scores.softmax(-1) @ v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [1, 2, 7, 64])
def test_values_and_gradients_equal_the_dense_equation(causal, n):
    torch.manual_seed(n)
    q, k, v = (torch.randn(2, 4, n, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    m = torch.tensor(slopes(4), dtype=torch.float64)
    got = slope_bias.slope_attention(q, k, v, m, 8**-0.5, causal, block=4)
    want = dense_alibi(q, k, v, m, 8**-0.5, causal)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    grad = torch.randn_like(want)
    for a, b in zip(
        torch.autograd.grad(got, (q, k, v), grad),
        torch.autograd.grad(want, (q, k, v), grad),
        strict=True,
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-11)


def test_float32_rounding_does_not_grow_with_the_length():
    # the numbers a piece's keys see are measured from its block's edge, so the keys that carry
    # a query's weight see small ones however long the input; slope 0.5 is the steepest of an
    # 8-head model. The dense float32 path's own error here is about 5e-7.
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, 4096, 16) for _ in range(3))
    m = torch.tensor([0.5], dtype=torch.float64)
    for causal in (False, True):
        got = slope_bias.slope_attention(q, k, v, m, 0.25, causal)
        want = dense_alibi(q.double(), k.double(), v.double(), m, 0.25, causal)
        assert (got.double() - want).abs().max() < 2e-6


def spy(monkeypatch) -> list:
    calls: list = []
    real = slope_bias.slope_attention
    monkeypatch.setattr(
        slope_bias, "slope_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw)
    )
    return calls


@pytest.mark.parametrize("causal", [False, True])
def test_the_attention_module_takes_it_over_consecutive_positions(monkeypatch, causal):
    torch.manual_seed(1)
    enc = build_encoding("alibi", dim=32, heads=4, head_dim=8, causal=causal)
    att = Attention(32, 4, enc, causal=causal).double()
    monkeypatch.setattr(slope_bias, "BLOCK", 8)  # 20 tokens are then three blocks
    x = torch.randn(2, 20, 32, dtype=torch.float64, requires_grad=True)
    inputs = [x, *att.parameters()]

    def run():
        out = att(x, offset=5)  # positions 5 .. 24: still consecutive
        return out, torch.autograd.grad((out * out.detach().cos()).sum(), inputs)

    calls = spy(monkeypatch)
    fast, fast_grads = run()
    assert calls
    monkeypatch.setattr(slope_bias, "serves", lambda *a: False)
    slow, slow_grads = run()
    torch.testing.assert_close(fast, slow, rtol=0, atol=1e-12)
    for got, want in zip(fast_grads, slow_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-11)


def test_positions_with_a_gap_a_memory_or_one_block_go_the_usual_way(monkeypatch):
    att = Attention(32, 4, build_encoding("alibi", dim=32, heads=4, head_dim=8)).double()
    x = torch.randn(1, 6, 32, dtype=torch.float64)
    calls = spy(monkeypatch)
    att(x)  # one block: its dense bias is all the kernel would compute
    monkeypatch.setattr(slope_bias, "BLOCK", 2)
    att(x, positions=torch.tensor([0, 1, 2, 5, 6, 7]))
    att(x, memory=torch.randn(1, 3, 32, dtype=torch.float64))  # more keys than queries
    assert not calls
    att(x)
    assert calls

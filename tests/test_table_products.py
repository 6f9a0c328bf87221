"""``table_products``: each pair's ``x_i . table[ids[i, j]]``, by either of its two ways, against
the sum written out pair by pair, values and gradients in float64."""

from __future__ import annotations

import pytest
import torch

import posenc_cli.kernels.buckets as buckets
from posenc_cli.kernels.buckets import table_products


def written_out(x, table, ids):
    B, H, Nq, _ = x.shape
    out = torch.zeros(B, H, Nq, ids.shape[1], dtype=x.dtype)
    for b in range(B):
        for h in range(H):
            for i in range(Nq):
                for j in range(ids.shape[1]):
                    out[b, h, i, j] = x[b, h, i] @ table[h, ids[i, j]]
    return out


# (B, H, Nq, Nk, n, d, way): rows outnumbering keys pick rows first ("pairs"); as many rows as
# keys, or a copy of the rows larger than the scores (one batch row, wide heads), keep "scores"
SHAPES = [
    (3, 2, 5, 6, 40, 4, "pairs"),
    (3, 2, 7, 4, 30, 5, "pairs"),
    (3, 2, 5, 6, 6, 4, "scores"),
    (1, 2, 5, 6, 40, 8, "scores"),
]


@pytest.mark.parametrize("B, H, Nq, Nk, n, d, way", SHAPES)
def test_both_ways_equal_the_sum_written_out(monkeypatch, B, H, Nq, Nk, n, d, way):
    gen = torch.Generator().manual_seed(B * n + d)
    x = torch.randn(B, H, Nq, d, dtype=torch.float64, generator=gen, requires_grad=True)
    table = torch.randn(H, n, d, dtype=torch.float64, generator=gen, requires_grad=True)
    ids = torch.randint(0, n, (Nq, Nk), generator=gen)
    took = []
    gather = buckets.gather_buckets
    monkeypatch.setattr(buckets, "gather_buckets", lambda *a: took.append("scores") or gather(*a))
    got = table_products(x, table, ids)
    assert (took or ["pairs"]) == [way]
    want = written_out(x, table, ids)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    weights = torch.randn(want.shape, dtype=torch.float64, generator=gen)
    got_grads = torch.autograd.grad((got * weights).sum(), (x, table))
    want_grads = torch.autograd.grad((want * weights).sum(), (x, table))
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)

"""``table_products``: each pair's ``x_i . table[ids[i, j]]``, by either of its two ways and in
either layout, against the sum written out pair by pair, values and gradients in float64; and
the gather by key it uses for the transposed layout, with its scatter, against plain loops."""

from __future__ import annotations

import pytest
import torch

import posenc_cli.kernels.buckets as buckets
from posenc_cli.kernels.buckets import gather_by_key, scatter_add_by_key, table_products


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


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("B, H, Nq, Nk, n, d, way", SHAPES)
def test_both_ways_equal_the_sum_written_out(monkeypatch, B, H, Nq, Nk, n, d, way, transposed):
    gen = torch.Generator().manual_seed(B * n + d)
    x = torch.randn(B, H, Nq, d, dtype=torch.float64, generator=gen, requires_grad=True)
    table = torch.randn(H, n, d, dtype=torch.float64, generator=gen, requires_grad=True)
    ids = torch.randint(0, n, (Nq, Nk), generator=gen)
    took = []
    for name in ("gather_buckets", "gather_by_key"):
        gather = getattr(buckets, name)
        spy = lambda *a, gather=gather: took.append("scores") or gather(*a)  # noqa: E731
        monkeypatch.setattr(buckets, name, spy)
    got = table_products(x, table, ids, transposed)
    assert (took or ["pairs"]) == [way]
    want = written_out(x, table, ids)
    if transposed:
        want = want.transpose(-2, -1)
        assert got.shape == want.shape
        assert got.is_contiguous() or way == "pairs"  # gathered straight into that layout
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    weights = torch.randn(want.shape, dtype=torch.float64, generator=gen)
    got_grads = torch.autograd.grad((got * weights).sum(), (x, table))
    want_grads = torch.autograd.grad((want * weights).sum(), (x, table))
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_gather_by_key_picks_each_keys_bucket_laid_out_by_query():
    gen = torch.Generator().manual_seed(3)
    scores = torch.randn(2, 3, 5, 7, dtype=torch.float64, generator=gen)  # (B, H, Nk, nb)
    ids = torch.randint(0, 7, (4, 5), generator=gen)  # (Nq, Nk)
    got = gather_by_key(scores, ids)
    assert got.shape == (2, 3, 4, 5) and got.is_contiguous()
    for i in range(4):
        for j in range(5):
            assert torch.equal(got[:, :, i, j], scores[:, :, j, ids[i, j]])


def test_scatter_add_by_key_adds_into_a_slice_of_keys_and_is_the_gathers_gradient():
    gen = torch.Generator().manual_seed(4)
    buffer = torch.randn(2, 3, 9, 7, dtype=torch.float64, generator=gen)
    before = buffer.clone()
    ids = torch.randint(0, 7, (4, 5), generator=gen)  # 4 queries against keys 2..6
    grad = torch.randn(2, 3, 4, 5, dtype=torch.float64, generator=gen)
    scatter_add_by_key(buffer[:, :, 2:7], ids, grad)
    want = before.clone()
    for i in range(4):
        for j in range(5):
            want[:, :, 2 + j, ids[i, j]] += grad[:, :, i, j]
    torch.testing.assert_close(buffer, want, rtol=1e-12, atol=1e-12)
    scores = before[:, :, 2:7].clone().requires_grad_(True)
    (autograd,) = torch.autograd.grad(gather_by_key(scores, ids), scores, grad)
    torch.testing.assert_close(autograd, (want - before)[:, :, 2:7], rtol=1e-12, atol=1e-12)

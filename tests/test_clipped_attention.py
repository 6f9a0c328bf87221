"""Shaw's clipped relative attention on the flash kernel (kernels/clipped_attention.py) against
dense autograd in float64: output and every gradient, with far regions on both sides, memory,
causal masks and either table alone; and the attention module taking it only where it applies."""

from __future__ import annotations

import itertools

import pytest
import torch

import posenc_cli.kernels.clipped_attention as clipped
from posenc_cli.encodings.shaw import ShawRelative, shaw_buckets
from posenc_cli.encodings.t5 import T5Bias, relative_position_bucket
from posenc_cli.kernels.buckets import gather_buckets, sum_per_bucket
from posenc_cli.models.attention import Attention


def dense(q, k, v, key_table, value_table, clip, scale, key_scale, causal):
    """softmax(q k^T s + s_K q . w^K[b]) (v + w^V[b]) with a full (N, Nk) bucket map."""
    n, nk = q.shape[-2], k.shape[-2]
    k_pos = torch.arange(nk)
    ids = shaw_buckets(k_pos[nk - n :], k_pos, clip)  # (N, Nk)
    logits = q @ k.transpose(-2, -1) * scale
    if key_table is not None:
        logits = logits + gather_buckets(q @ key_table.T * key_scale, ids)
    if causal:
        logits = logits.masked_fill(k_pos[None, :] > k_pos[nk - n :, None], float("-inf"))
    prob = logits.softmax(-1)
    out = prob @ v
    if value_table is not None:
        out = out + sum_per_bucket(prob, ids, 2 * clip + 1) @ value_table
    return out


CASES = [
    (n, memory, clip, causal, tables)
    for n, memory, clip, causal, tables in itertools.product(
        [1, 13], [0, 6], [0, 2], [False, True], ["both", "key", "value"]
    )
]


@pytest.mark.parametrize(("n", "memory", "clip", "causal", "tables"), CASES)
def test_matches_dense_attention_and_its_gradients(monkeypatch, n, memory, clip, causal, tables):
    monkeypatch.setattr(clipped, "BLOCK", 4)  # several blocks, each with far keys on both sides
    gen = torch.Generator().manual_seed(n * 31 + memory * 7 + clip)
    nk = n + memory

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64, requires_grad=True)

    q, k, v = rand(2, 3, n, 8), rand(2, 3, nk, 8), rand(2, 3, nk, 8)
    key_table = rand(2 * clip + 1, 8) if tables in ("both", "key") else None
    value_table = rand(2 * clip + 1, 8) if tables in ("both", "value") else None
    inputs = [t for t in (q, k, v, key_table, value_table) if t is not None]
    args = (clip, 0.3, 0.4, causal)
    got = clipped.clipped_relative_attention(q, k, v, key_table, value_table, *args)
    want = dense(q, k, v, key_table, value_table, *args)
    torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-9)
    weights = torch.randn(got.shape, generator=gen, dtype=torch.float64)
    grads = torch.autograd.grad((got * weights).sum(), inputs)
    expected = torch.autograd.grad((want * weights).sum(), inputs)
    for a, b in zip(grads, expected, strict=True):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)


def test_attention_takes_it_only_without_a_key_mask(monkeypatch):
    monkeypatch.setattr(clipped, "MIN_PAIRS", 0)  # small sizes take the explicit path otherwise
    torch.manual_seed(0)
    enc = ShawRelative(max_distance=2, heads=2, head_dim=4)
    attn = Attention(8, 2, enc).double()
    x = torch.randn(2, 11, 8, dtype=torch.float64, requires_grad=True)
    calls = []
    original = clipped._ClippedRelativeAttention.apply
    monkeypatch.setattr(
        clipped._ClippedRelativeAttention,
        "apply",
        lambda *a: calls.append(1) or original(*a),
    )
    fast = attn(x)
    assert calls == [1]
    # an all-True key mask changes nothing but sends it down the generic path
    generic = attn(x, key_mask=torch.ones(2, 11, dtype=torch.bool))
    assert calls == [1]
    torch.testing.assert_close(fast, generic, atol=1e-12, rtol=1e-12)
    weights = torch.randn_like(fast)
    params = [x, enc.key_table, enc.value_table, attn.q.weight]
    for a, b in zip(
        torch.autograd.grad((fast * weights).sum(), params),
        torch.autograd.grad((generic * weights).sum(), params),
        strict=True,
    ):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)
    # short inputs, and positions that are not consecutive, also take the generic path
    monkeypatch.setattr(clipped, "MIN_PAIRS", 11 * 11)
    attn(x)
    assert calls == [1]
    monkeypatch.setattr(clipped, "MIN_PAIRS", 0)
    assert (
        enc.attend(x[:, None], x[:, None], x[:, None], None, torch.tensor([0, 2, 3]), 1, False)
        is None
    )


@pytest.mark.parametrize(
    ("bidirectional", "causal", "memory"), [(True, False, 0), (False, True, 5)]
)
def test_t5_bias_on_the_kernel_matches_the_dense_bias(monkeypatch, bidirectional, causal, memory):
    """T5's buckets stop changing past max_distance: the same kernel, with a per-head bias
    table instead of Shaw's key table, against the dense (H, N, N) bias and autograd."""
    monkeypatch.setattr(clipped, "BLOCK", 4)
    monkeypatch.setattr(clipped, "SATURATED_MIN_KEYS", 1)
    torch.manual_seed(1)
    enc = T5Bias(num_buckets=8, max_distance=6, bidirectional=bidirectional, heads=2, head_dim=4)
    torch.nn.init.normal_(enc.table.weight)
    n, nk = 23, 23 + memory
    q = torch.randn(2, 2, n, 4, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, 2, nk, 4, dtype=torch.float64, requires_grad=True) for _ in range(2))
    k_pos = torch.arange(3, 3 + nk)
    q_pos = k_pos[nk - n :]
    got = enc.attend(q, k, v, q_pos, k_pos, 0.5, causal)
    assert got is not None
    logits = q @ k.transpose(-2, -1) * 0.5 + enc.bias(q, k, q_pos, k_pos).double()
    if causal:
        logits = logits.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))
    want = logits.softmax(-1) @ v
    torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-9)
    with torch.no_grad():  # a forward pass leaves consecutive positions to the table's view
        assert enc.attend(q, k, v, q_pos, k_pos, 0.5, causal) is None
    weights = torch.randn_like(want)
    inputs = (q, k, v, enc.table.weight)
    for a, b in zip(
        torch.autograd.grad((got * weights).sum(), inputs),
        torch.autograd.grad((want * weights).sum(), inputs),
        strict=True,
    ):
        torch.testing.assert_close(a.double(), b.double(), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(
    ("n", "memory", "clip", "block", "causal"),
    [(37, 0, 2, 4, False), (37, 5, 3, 4, True), (50, 0, 0, 7, False), (9, 3, 6, 2, False)],
)
def test_layout_covers_every_pair_once_with_far_pairs_in_their_end_bucket(
    monkeypatch, n, memory, clip, block, causal
):
    """Near windows and far rectangles tile the (query, key) grid: every allowed pair once, and a
    far rectangle only holds pairs whose bucket is its side's last one."""
    monkeypatch.setattr(clipped, "BLOCK", block)
    keys = n + memory
    layout = clipped.Layout(n, keys, causal, torch.arange(2 * clip + 1))
    count = torch.zeros(n, keys, dtype=torch.long)
    for blk in layout.blocks:
        count[blk.rows, blk.near] += 1
    rel = torch.arange(keys)[None, :] - (torch.arange(n)[:, None] + memory)  # key - query
    for side, rectangles in enumerate(layout.far):
        for rows, cols in rectangles:
            count[rows, cols] += 1
            far = rel[rows, cols]
            assert bool((far <= -clip).all()) if side == 0 else bool((far >= clip).all())
    covered = count if not causal else count.masked_select(rel <= 0)
    assert bool((covered == 1).all())
    if causal:  # no far right, and no near key past a block's last query: all in the future
        assert not layout.far[1]
        assert all(blk.near.stop == blk.rows.stop + memory for blk in layout.blocks)


def test_saturated_core_keeps_every_t5_bucket():
    """T5's default buckets stop changing at distance 91, not at max_distance 128: the trimmed
    lookup gives the published bucket for every relative position."""
    enc = T5Bias()
    core = clipped.saturated_core(enc.lookup)
    clip = (len(core) - 1) // 2
    assert clip == 91
    rel = torch.arange(-300, 301)
    assert torch.equal(core[rel.clamp(-clip, clip) + clip], relative_position_bucket(rel))
    assert torch.equal(clipped.saturated_core(torch.arange(9)), torch.arange(9))  # Shaw's


@pytest.mark.parametrize("causal", [False, True])
def test_many_blocks_match_dense_attention(monkeypatch, causal):
    """Ten blocks: the far staircase is cut into rectangles over several levels."""
    monkeypatch.setattr(clipped, "BLOCK", 4)
    gen = torch.Generator().manual_seed(3)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64, requires_grad=True)

    q, k, v = rand(2, 2, 37, 8), rand(2, 2, 40, 8), rand(2, 2, 40, 8)
    key_table, value_table = rand(5, 8), rand(5, 8)
    args = (2, 0.3, 0.4, causal)
    got = clipped.clipped_relative_attention(q, k, v, key_table, value_table, *args)
    want = dense(q, k, v, key_table, value_table, *args)
    torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-9)
    inputs = (q, k, v, key_table, value_table)
    weights = torch.randn(got.shape, generator=gen, dtype=torch.float64)
    for a, b in zip(
        torch.autograd.grad((got * weights).sum(), inputs),
        torch.autograd.grad((want * weights).sum(), inputs),
        strict=True,
    ):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)

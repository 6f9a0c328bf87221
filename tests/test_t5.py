"""T5 bucketed relative bias: bucket ids against the published formula, invariances, sharing,
gradients, and the fused attention path against a dense float64 reference."""

from __future__ import annotations

import math

import pytest
import torch

from posenc_cli.encodings import build_encoding
from posenc_cli.encodings.t5 import T5Bias, relative_position_bucket
from posenc_cli.errors import UsageError
from posenc_cli.models.attention import Attention

CONFIGS = [(32, 128), (16, 64), (64, 256)]


def reference_bucket(rel: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """Raffel et al. 2020 / the T5 reference code, on one Python int, with ``math`` only."""
    offset = 0
    if bidirectional:
        num_buckets //= 2
        if rel > 0:
            offset = num_buckets
        n = abs(rel)
    else:
        n = max(-rel, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return offset + n
    large = max_exact + int(
        math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    )
    return offset + min(large, num_buckets - 1)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("num_buckets", "max_distance"), CONFIGS)
def test_buckets_match_published_formula(bidirectional, num_buckets, max_distance):
    rel = torch.arange(-300, 301)
    got = relative_position_bucket(rel, bidirectional, num_buckets, max_distance)
    want = [reference_bucket(r, bidirectional, num_buckets, max_distance) for r in range(-300, 301)]
    assert got.dtype == torch.int64
    assert got.tolist() == want
    assert int(got.min()) == 0 and int(got.max()) == num_buckets - 1  # every bucket reachable


def test_hand_checked_buckets():
    # Bidirectional 32/128: 16 buckets per side, 8 exact, then 8 + floor(2 log2(d / 8)).
    rel = torch.tensor([0, 1, -1, 7, 8, -16, 16, 90, 91, 127, 300, -300])
    want = [0, 17, 1, 23, 24, 10, 26, 30, 31, 31, 31, 15]  # 90 < 8 * 2^3.5 = 90.5 <= 91
    assert relative_position_bucket(rel, True, 32, 128).tolist() == want
    # Causal 32/128: 32 buckets for j <= i, 16 exact, then 16 + floor(16 log(d / 16) / log 8).
    rel = torch.tensor([3, 1, 0, -1, -15, -16, -32, -127, -128, -300])
    want = [0, 0, 0, 1, 15, 16, 21, 31, 31, 31]
    assert relative_position_bucket(rel, False, 32, 128).tolist() == want


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("num_buckets", "max_distance"), CONFIGS)
def test_buckets_monotone_in_distance_per_side(bidirectional, num_buckets, max_distance):
    d = torch.arange(0, 400)
    before = relative_position_bucket(-d, bidirectional, num_buckets, max_distance)
    assert (before.diff() >= 0).all()
    if bidirectional:
        after = relative_position_bucket(d[1:], bidirectional, num_buckets, max_distance)
        assert (after.diff() >= 0).all()
        # the sides never share a bucket; bucket nb/2 (positive side, distance 0) goes unused
        assert int(before.max()) == num_buckets // 2 - 1
        assert int(after.min()) == num_buckets // 2 + 1


def test_bias_is_table_at_bucket_including_far_positions():
    enc = T5Bias(heads=3, head_dim=4, num_buckets=16, max_distance=20).double()
    q_pos = torch.tensor([0, 5, 40])
    k_pos = torch.tensor([-30, 0, 3, 6, 45, 100])
    bias = enc.bias(None, None, q_pos, k_pos)
    assert bias.shape == (1, 3, 3, 6)
    table = enc.table.weight
    for i, qi in enumerate(q_pos.tolist()):
        for j, kj in enumerate(k_pos.tolist()):
            b = reference_bucket(kj - qi, True, 16, 20)
            for h in range(3):
                assert bias[0, h, i, j].item() == table[b, h].item()


def test_bias_depends_only_on_key_minus_query():
    enc = T5Bias(heads=2, head_dim=4, num_buckets=8, max_distance=16)
    q_pos, k_pos = torch.arange(4, 9), torch.arange(9)
    base = enc.bias(None, None, q_pos, k_pos)
    torch.testing.assert_close(enc.bias(None, None, q_pos + 37, k_pos + 37), base)
    # and it does depend on the offset between queries and keys
    assert not torch.equal(enc.bias(None, None, q_pos - 3, k_pos), base)

    torch.manual_seed(0)
    attn = Attention(8, 2, encoding=enc).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    torch.testing.assert_close(attn(x, offset=11), attn(x), atol=1e-12, rtol=1e-12)


def test_bidirectional_default_follows_causal():
    assert T5Bias(causal=False).bidirectional is True
    assert T5Bias(causal=True).bidirectional is False
    assert T5Bias(causal=True, bidirectional=True).bidirectional is True
    enc = build_encoding("t5", heads=4, head_dim=8, causal=True, num_buckets="16")
    assert enc.table.weight.shape == (16, 4) and not enc.bidirectional


@pytest.mark.parametrize(
    "params",
    [
        {"num_buckets": 1},
        {"num_buckets": 31},  # bidirectional needs an even count
        {"num_buckets": 2},  # bidirectional: one bucket per side leaves no exact range
        {"num_buckets": 32, "max_distance": 8},  # must exceed max_exact = 8
        {"num_buckets": 32, "max_distance": 16, "bidirectional": False},  # max_exact = 16
        {"heads": 0},
    ],
)
def test_invalid_params_raise_usage_error(params):
    with pytest.raises(UsageError):
        T5Bias(**params)


def test_valid_edge_params():
    T5Bias(num_buckets=31, bidirectional=False)  # odd is fine with one side
    T5Bias(num_buckets=2, max_distance=2, bidirectional=False)
    T5Bias(num_buckets=4, max_distance=2)


def test_shared_by_layers_and_gradients_accumulate():
    assert T5Bias.per_layer is False
    torch.manual_seed(1)
    enc = T5Bias(heads=2, head_dim=4, num_buckets=8, max_distance=16).double()
    layers = torch.nn.ModuleList([Attention(8, 2, encoding=enc) for _ in range(2)]).double()
    assert layers[0].encoding is layers[1].encoding
    assert sum(p is enc.table.weight for p in layers.parameters()) == 1  # one table, listed once
    x = torch.randn(1, 5, 8, dtype=torch.float64)

    def grad_of(run):
        enc.zero_grad()
        run().sum().backward()
        return enc.table.weight.grad.clone()

    g0 = grad_of(lambda: layers[0](x))
    g1 = grad_of(lambda: layers[1](x))
    both = grad_of(lambda: layers[0](x) + layers[1](x))
    torch.testing.assert_close(both, g0 + g1)


def test_gradient_reaches_exactly_the_used_buckets():
    torch.manual_seed(2)
    enc = T5Bias(heads=2, head_dim=4)  # 32 buckets, 128 max distance, bidirectional
    attn = Attention(8, 2, encoding=enc)
    x = torch.randn(2, 5, 8)
    (attn(x) ** 2).sum().backward()
    grad = enc.table.weight.grad
    used = {reference_bucket(r, True, 32, 128) for r in range(-4, 5)}  # 0..4 and 17..20
    assert used == {0, 1, 2, 3, 4, 17, 18, 19, 20}
    nonzero = set(torch.nonzero(grad.abs().sum(dim=1)).flatten().tolist())
    assert nonzero == used


def dense_reference(attn, x, table, bidirectional, nb, md, memory=None, key_mask=None, offset=0):
    """softmax(q k^T / sqrt(d) + bias) v in float64, bias by the scalar formula."""
    context = x if memory is None else torch.cat([memory, x], dim=1)
    B, N, D = x.shape
    Nk, H = context.shape[1], attn.heads
    d = D // H
    q = x @ attn.q.weight.T + attn.q.bias
    k, v = (context @ attn.kv.weight.T + attn.kv.bias).split(D, dim=-1)
    q, k, v = (t.view(B, -1, H, d).transpose(1, 2) for t in (q, k, v))
    k_pos = list(range(offset, offset + Nk))
    q_pos = k_pos[Nk - N :]
    bias = torch.empty(H, N, Nk, dtype=torch.float64)
    for h in range(H):
        for i, qi in enumerate(q_pos):
            for j, kj in enumerate(k_pos):
                bias[h, i, j] = table[reference_bucket(kj - qi, bidirectional, nb, md), h]
    logits = q @ k.transpose(-2, -1) / math.sqrt(d) + bias  # (B, H, N, Nk)
    allowed = torch.ones(B, 1, N, Nk, dtype=torch.bool)
    if attn.causal:
        allowed &= torch.tensor([[kj <= qi for kj in k_pos] for qi in q_pos])
    if key_mask is not None:
        allowed &= key_mask[:, None, None, :]
    logits = logits.masked_fill(~allowed, float("-inf"))
    out = logits.softmax(dim=-1) @ v  # (B, H, N, d)
    return out.transpose(1, 2).reshape(B, N, D) @ attn.proj.weight.T + attn.proj.bias


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mem", [0, 4])
@pytest.mark.parametrize("padded", [False, True])
def test_fused_attention_matches_dense_reference(causal, mem, padded):
    torch.manual_seed(3)
    nb, md = 8, 6  # small enough that the log-spaced and capped buckets are all exercised
    enc = T5Bias(heads=2, head_dim=4, num_buckets=nb, max_distance=md, causal=causal)
    attn = Attention(8, 2, encoding=enc, causal=causal).double()
    with torch.no_grad():
        enc.table.weight.normal_(std=2.0)  # large enough to matter against the content term
    B, N = 2, 6
    x = torch.randn(B, N, 8, dtype=torch.float64)
    memory = torch.randn(B, mem, 8, dtype=torch.float64) if mem else None
    key_mask = None
    if padded:
        key_mask = torch.ones(B, mem + N, dtype=torch.bool)
        key_mask[1, -2:] = False  # the first key stays real, so no query row is fully masked
    got = attn(x, memory=memory, key_mask=key_mask, offset=5)
    want = dense_reference(
        attn, x, enc.table.weight.detach(), not causal, nb, md, memory, key_mask, offset=5
    )
    read = torch.ones(B, N, dtype=torch.bool)
    if key_mask is not None and causal:  # a padded query's output is not defined then
        read = key_mask[:, -N:]
    torch.testing.assert_close(got[read], want[read], atol=1e-9, rtol=1e-9)
    # the bias matters: without it the output differs
    plain = Attention(8, 2, causal=causal).double()
    plain.load_state_dict(attn.state_dict(), strict=False)
    assert not torch.allclose(plain(x, memory=memory, key_mask=key_mask), got, atol=1e-3)


def test_causal_output_ignores_future_tokens():
    torch.manual_seed(4)
    enc = T5Bias(heads=2, head_dim=4, causal=True)
    attn = Attention(8, 2, encoding=enc, causal=True).double()
    x = torch.randn(1, 7, 8, dtype=torch.float64)
    y = x.clone()
    y[:, 4:] = torch.randn(1, 3, 8, dtype=torch.float64)
    torch.testing.assert_close(attn(y)[:, :4], attn(x)[:, :4], atol=1e-12, rtol=1e-12)

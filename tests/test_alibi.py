"""ALiBi: slopes against published values, the bias formula, causality, and the fused attention
path against dense float64 references (the symmetric form and the reference code's causal form)."""

from __future__ import annotations

import math

import pytest
import torch

from posenc_cli.encodings import build_encoding
from posenc_cli.encodings.alibi import ALiBi, slopes
from posenc_cli.errors import UsageError
from posenc_cli.models.attention import Attention

# Worked out by hand from the recipe; 8 and 12 are the values the paper's code prints.
PUBLISHED = {
    # 6 heads: the 4-head sequence 2^-2, 2^-4, 2^-6, 2^-8, then 2^-1, 2^-3 (8-head, every other)
    6: [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125],
    8: [0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625],
    # 12 heads: 2^-1 .. 2^-8, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5
    12: [0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625]
    + [0.7071067811865476, 0.35355339059327373, 0.17677669529663687, 0.08838834764831845],
    # 16 heads: 2^-0.5, 2^-1, ..., 2^-8
    16: [
        0.7071067811865476,
        0.5,
        0.35355339059327373,
        0.25,
        0.17677669529663687,
        0.125,
        0.08838834764831845,
        0.0625,
        0.044194173824159216,
        0.03125,
        0.02209708691207961,
        0.015625,
        0.011048543456039806,
        0.0078125,
        0.005524271728019903,
        0.00390625,
    ],
    1: [0.00390625],
    4: [0.25, 0.0625, 0.015625, 0.00390625],
    3: [0.0625, 0.00390625, 0.25],  # 2-head 2^-4, 2^-8, then 4-head's first, 2^-2
}


@pytest.mark.parametrize("heads", sorted(PUBLISHED))
def test_slopes_match_published_values(heads):
    got = slopes(heads)
    assert len(got) == heads
    for g, w in zip(got, PUBLISHED[heads], strict=True):
        assert math.isclose(g, w, rel_tol=1e-12)


def test_twelve_heads_differ_from_plain_geometric():
    # The shortcut 2^(-8 (h+1) / n) used by some libraries is not the paper's recipe.
    plain = [2 ** (-8 * (h + 1) / 12) for h in range(12)]
    assert not all(math.isclose(a, b) for a, b in zip(slopes(12), plain, strict=True))


def test_invalid_heads_raise_usage_error():
    with pytest.raises(UsageError):
        slopes(0)
    with pytest.raises(UsageError):
        ALiBi(heads=0)


def test_no_learned_parameters_and_shared():
    enc = build_encoding("alibi", heads=4, head_dim=8, causal=True)
    assert isinstance(enc, ALiBi)
    assert list(enc.parameters()) == [] and enc.state_dict() == {}
    assert ALiBi.per_layer is False and ALiBi.family == "bias"


def test_bias_formula_with_memory_and_offset():
    enc = ALiBi(heads=6)
    q = torch.zeros(1, 6, 3, 4, dtype=torch.float64)
    k_pos = torch.arange(10, 17)  # 4 memory keys, then the 3 queries
    q_pos = k_pos[-3:]
    bias = enc.bias(q, q, q_pos, k_pos)
    assert bias.shape == (1, 6, 3, 7) and bias.dtype == torch.float64
    for h in range(6):
        for i, qi in enumerate(q_pos.tolist()):
            for j, kj in enumerate(k_pos.tolist()):
                assert bias[0, h, i, j].item() == -PUBLISHED[6][h] * abs(qi - kj)
    # only the distance matters: shifting every position changes nothing
    torch.testing.assert_close(enc.bias(q, q, q_pos + 100, k_pos + 100), bias, atol=0, rtol=0)


def test_bias_dtype_follows_queries():
    enc = ALiBi(heads=2)
    pos = torch.arange(4)
    assert enc.bias(torch.zeros(1, 2, 4, 4), None, pos, pos).dtype == torch.float32
    half = torch.zeros(1, 2, 4, 4, dtype=torch.float16)
    assert enc.bias(half, None, pos, pos).dtype == torch.float32  # attention casts it down


def dense_reference(attn, x, bias_of, memory=None, key_mask=None):
    """softmax(q k^T / sqrt(d) + bias) v in float64; ``bias_of(h, qi, kj)`` gives each entry."""
    context = x if memory is None else torch.cat([memory, x], dim=1)
    B, N, D = x.shape
    Nk, H = context.shape[1], attn.heads
    d = D // H
    q = x @ attn.q.weight.T + attn.q.bias
    k, v = (context @ attn.kv.weight.T + attn.kv.bias).split(D, dim=-1)
    q, k, v = (t.view(B, -1, H, d).transpose(1, 2) for t in (q, k, v))
    k_pos = list(range(Nk))
    q_pos = k_pos[Nk - N :]
    bias = torch.tensor(
        [[[bias_of(h, qi, kj) for kj in k_pos] for qi in q_pos] for h in range(H)],
        dtype=torch.float64,
    )  # (H, N, Nk)
    logits = q @ k.transpose(-2, -1) / math.sqrt(d) + bias
    allowed = torch.ones(B, 1, N, Nk, dtype=torch.bool)
    if attn.causal:
        allowed &= torch.tensor([[kj <= qi for kj in k_pos] for qi in q_pos])
    if key_mask is not None:
        allowed &= key_mask[:, None, None, :]
    logits = logits.masked_fill(~allowed, float("-inf"))
    out = logits.softmax(dim=-1) @ v  # (B, H, N, d)
    return out.transpose(1, 2).reshape(B, N, D) @ attn.proj.weight.T + attn.proj.bias


def make_attention(heads: int, causal: bool, seed: int) -> Attention:
    torch.manual_seed(seed)
    return Attention(
        4 * heads, heads, encoding=ALiBi(heads=heads, head_dim=4), causal=causal
    ).double()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mem", [0, 3])
@pytest.mark.parametrize("padded", [False, True])
def test_fused_attention_matches_dense_reference(causal, mem, padded):
    heads = 3
    attn = make_attention(heads, causal, seed=5)
    B, N = 2, 5
    x = torch.randn(B, N, 4 * heads, dtype=torch.float64)
    memory = torch.randn(B, mem, 4 * heads, dtype=torch.float64) if mem else None
    key_mask = None
    if padded:
        key_mask = torch.ones(B, mem + N, dtype=torch.bool)
        key_mask[0, -2:] = False  # the first key stays real, so no query row is fully masked
    got = attn(x, memory=memory, key_mask=key_mask, offset=7)

    def symmetric(h, qi, kj):
        return -PUBLISHED[3][h] * abs(qi - kj)

    want = dense_reference(attn, x, symmetric, memory, key_mask)
    read = torch.ones(B, N, dtype=torch.bool)
    if key_mask is not None and causal:  # a padded query's output is not defined then
        read = key_mask[:, -N:]
    torch.testing.assert_close(got[read], want[read], atol=1e-9, rtol=1e-9)
    # the bias matters: without it the output differs
    plain = Attention(4 * heads, heads, causal=causal).double()
    plain.load_state_dict(attn.state_dict())
    assert not torch.allclose(plain(x, memory=memory, key_mask=key_mask), got, atol=1e-3)


def test_causal_equals_reference_codes_per_key_form():
    # Press et al.'s code adds slope * j (a constant per query row away from -slope * (i - j)).
    attn = make_attention(4, causal=True, seed=6)
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    want = dense_reference(attn, x, lambda h, qi, kj: PUBLISHED[4][h] * kj)
    torch.testing.assert_close(attn(x), want, atol=1e-9, rtol=1e-9)


def test_causal_output_ignores_future_tokens():
    x = torch.randn(1, 8, 16, dtype=torch.float64)
    y = x.clone()
    y[:, 5:] = torch.randn(1, 3, 16, dtype=torch.float64)
    causal = make_attention(4, causal=True, seed=7)
    torch.testing.assert_close(causal(y)[:, :5], causal(x)[:, :5], atol=1e-12, rtol=1e-12)
    # sanity: without the causal mask the same change does reach earlier outputs
    full = make_attention(4, causal=False, seed=7)
    assert not torch.allclose(full(y)[:, :5], full(x)[:, :5], atol=1e-6)

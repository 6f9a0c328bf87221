"""Transformer-XL relative encoding against the paper's four-term score written out plainly."""

from __future__ import annotations

import math

import pytest
import torch

from posenc_cli.encodings import build_encoding
from posenc_cli.encodings.absolute import sinusoidal_table
from posenc_cli.encodings.xl import TransformerXLRelative, distance_index, relative_sinusoid
from posenc_cli.errors import UsageError
from posenc_cli.models.attention import Attention

DIM, HEADS = 8, 2


def r_vector(x: int, dim: int, base: float) -> list[float]:
    """R_x, the reference code's layout: sin(x w_k) for k < dim/2, then cos(x w_k)."""
    freqs = [base ** (-(2 * k) / dim) for k in range(dim // 2)]
    return [math.sin(x * w) for w in freqs] + [math.cos(x * w) for w in freqs]


def make(causal: bool, seed: int = 0, **params) -> Attention:
    torch.manual_seed(seed)
    enc = TransformerXLRelative(
        dim=DIM, heads=HEADS, head_dim=DIM // HEADS, causal=causal, **params
    )
    attn = Attention(DIM, HEADS, enc, causal=causal).double()
    with torch.no_grad():  # larger than the 0.02 init so every term matters
        for p in (enc.u, enc.v, enc.proj.weight):
            p.normal_()
    return attn


def dense_reference(attn: Attention, x, memory=None, key_mask=None, offset: int = 0):
    """Loop over (i, j) with explicit R_{i-j}; returns (output, bias without term (a))."""
    enc = attn.encoding
    H, d = attn.heads, attn.head_dim
    context = x if memory is None else torch.cat([memory, x], dim=1)
    B, N, D = x.shape
    Nk = context.shape[1]
    M = Nk - N
    q = attn.q(x).view(B, N, H, d)
    k, val = (t.reshape(B, Nk, H, d) for t in attn.kv(context).chunk(2, dim=-1))
    wr, u, v = enc.proj.weight, enc.u, enc.v
    out = torch.zeros(B, N, H, d, dtype=x.dtype)
    bias = torch.zeros(B, H, N, Nk, dtype=x.dtype)
    for b in range(B):
        for h in range(H):
            for i in range(N):
                scores = []
                for j in range(Nk):
                    qi, kj = q[b, i, h], k[b, j, h]
                    dist = (offset + M + i) - (offset + j)
                    if enc.clamp_len is not None:
                        dist = max(-enc.clamp_len, min(enc.clamp_len, dist))
                    r = torch.tensor(r_vector(dist, D, enc.base), dtype=x.dtype)
                    wr_r = (wr @ r).view(H, d)[h]  # W_R R_{i-j} for head h
                    term_b, term_c, term_d = qi @ wr_r, u[h] @ kj, v[h] @ wr_r
                    bias[b, h, i, j] = (term_b + term_c + term_d) / math.sqrt(d)
                    score = (qi @ kj + term_b + term_c + term_d) / math.sqrt(d)
                    masked = (attn.causal and j > M + i) or (
                        key_mask is not None and not key_mask[b, j]
                    )
                    scores.append(-math.inf if masked else score)
                weights = torch.stack([torch.as_tensor(s, dtype=x.dtype) for s in scores]).softmax(
                    0
                )
                out[b, i, h] = sum(weights[j] * val[b, j, h] for j in range(Nk))
    return attn.proj(out.reshape(B, N, D)), bias


def hook_bias(attn: Attention, x, memory=None, offset: int = 0):
    context = x if memory is None else torch.cat([memory, x], dim=1)
    N, Nk = x.shape[1], context.shape[1]
    k_pos = torch.arange(offset, offset + Nk)
    q = attn.split_heads(attn.q(x))
    k = attn.split_heads(attn.kv(context).chunk(2, dim=-1)[0])
    return attn.encoding.bias(q, k, k_pos[Nk - N :], k_pos)


def close(a, b):
    torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)


def test_relative_sinusoid_formula_and_layout():
    dists = torch.arange(-5, 7)
    got = relative_sinusoid(dists, 6, 10000.0)
    want = torch.tensor([r_vector(int(x), 6, 10000.0) for x in dists], dtype=torch.float64)
    close(got, want)
    # same numbers as Vaswani's interleaved table, columns permuted: sin half = even columns
    table = sinusoidal_table(7, 6).double()
    pos = relative_sinusoid(torch.arange(7), 6)
    torch.testing.assert_close(pos[:, :3], table[:, 0::2], atol=1e-6, rtol=0)
    torch.testing.assert_close(pos[:, 3:], table[:, 1::2], atol=1e-6, rtol=0)


def test_distance_index_ranges():
    q_pos, k_pos = torch.arange(3, 6), torch.arange(0, 6)  # memory of 3 then 3 queries
    ids, dists = distance_index(q_pos, k_pos)
    assert dists.tolist() == list(range(-2, 6))  # q.min - k.max .. q.max - k.min
    assert (dists[ids] == q_pos[:, None] - k_pos[None, :]).all()
    ids, dists = distance_index(q_pos, k_pos, causal=True)
    assert dists.tolist() == list(range(0, 6))
    assert dists[ids][0].tolist() == [3, 2, 1, 0, 0, 0]  # future pairs read 0
    ids, dists = distance_index(q_pos, k_pos, clamp_len=2)
    assert dists.tolist() == [-2, -1, 0, 1, 2]
    assert dists[ids][2].tolist() == [2, 2, 2, 2, 1, 0]


@pytest.mark.parametrize(
    ("causal", "memory_len", "padded", "clamp_len"),
    [(True, 3, False, None), (False, 0, False, None), (False, 2, True, None), (True, 2, True, 2)],
    ids=["causal-memory", "bidirectional", "bidirectional-memory-padding", "causal-clamp"],
)
def test_matches_dense_four_term_reference(causal, memory_len, padded, clamp_len):
    attn = make(causal, clamp_len=clamp_len)
    B, N = 2, 4
    x = torch.randn(B, N, DIM, dtype=torch.float64)
    memory = torch.randn(B, memory_len, DIM, dtype=torch.float64) if memory_len else None
    key_mask = None
    if padded:
        key_mask = torch.ones(B, memory_len + N, dtype=torch.bool)
        key_mask[0, 0] = False  # a padded memory slot
        key_mask[1, -2:] = False  # padded tail
    offset = 3
    with torch.no_grad():
        want_out, want_bias = dense_reference(attn, x, memory, key_mask, offset)
        got_out = attn(x, memory=memory, key_mask=key_mask, offset=offset)
        got_bias = hook_bias(attn, x, memory, offset)
    close(got_out, want_out)
    if causal:  # future pairs are masked; the hook leaves them at distance 0
        allowed = torch.ones(N, memory_len + N, dtype=torch.bool).tril(memory_len)
        got_bias, want_bias = got_bias[..., allowed], want_bias[..., allowed]
    close(got_bias, want_bias)


def test_bias_shape_and_content_term_broadcast():
    attn = make(False)
    x = torch.randn(2, 3, DIM, dtype=torch.float64)
    memory = torch.randn(2, 4, DIM, dtype=torch.float64)
    assert hook_bias(attn, x, memory).shape == (2, HEADS, 3, 7)
    with torch.no_grad():
        attn.encoding.proj.weight.zero_()  # W_R = 0 leaves only (c) = u . k_j / sqrt(d)
        bias = hook_bias(attn, x, memory)
    assert torch.equal(bias, bias[:, :, :1].expand_as(bias))  # does not depend on i
    k = attn.split_heads(attn.kv(torch.cat([memory, x], 1)).chunk(2, -1)[0]).detach()
    close(bias[:, :, 0], torch.einsum("bhjd,hd->bhj", k, attn.encoding.u.detach()) / 2.0)


@pytest.mark.parametrize("causal", [True, False])
def test_position_terms_depend_only_on_distance(causal):
    attn = make(causal)
    with torch.no_grad():
        attn.encoding.u.zero_()  # drop (c): what is left is (b) + (d)
        x = torch.randn(1, 5, DIM, dtype=torch.float64)
        memory = torch.randn(1, 3, DIM, dtype=torch.float64)
        base = hook_bias(attn, x, memory, offset=0)
        for shift in (1, 7, 1000):
            close(hook_bias(attn, x, memory, offset=shift), base)
            close(attn(x, memory=memory, offset=shift), attn(x, memory=memory))
    # ... and it does depend on distance: query 4 against keys at distances 7 .. 0 differ
    row = base[0, 0, 4]
    assert len({round(float(s), 9) for s in row}) == len(row)


def test_clamp_len_merges_far_distances():
    attn = make(True, clamp_len=2)
    with torch.no_grad():
        attn.encoding.u.zero_()
        bias = hook_bias(attn, torch.randn(1, 6, DIM, dtype=torch.float64))
    row = bias[0, 0, 5]  # distances 5, 4, 3, 2, 1, 0
    close(row[:3], row[3].expand(3))
    assert not torch.allclose(row[3], row[4])


def test_memory_queries_attend_memory_keys_at_their_distance():
    """Position-only scores peaked at distance 4: query i (position M+i) reads key M+i-4."""
    delta, M, N, D = 4, 5, 3, 8
    enc = TransformerXLRelative(dim=D, heads=1, head_dim=D, causal=True)
    attn = Attention(D, 1, enc, causal=True).double()
    with torch.no_grad():
        for p in attn.parameters():
            p.zero_()
        attn.kv.weight[D:] = torch.eye(D)  # values pass tokens through
        attn.proj.weight.copy_(torch.eye(D))
        # v . W_R R_x = A * sum_k cos(w_k (x - delta)), largest at x = delta
        w = torch.tensor([10000.0 ** (-(2 * k) / D) for k in range(D // 2)], dtype=torch.float64)
        enc.proj.weight[0] = torch.cat([(w * delta).sin(), (w * delta).cos()])
        enc.v[0, 0] = 100.0 * math.sqrt(D)
        tokens = torch.eye(M + N, D, dtype=torch.float64)[None]  # token t is one-hot e_t
        out = attn(tokens[:, M:], memory=tokens[:, :M], offset=11)
    want = tokens[0, M - delta : M + N - delta]  # keys 1, 2, 3: all in the memory
    torch.testing.assert_close(out[0], want, atol=1e-6, rtol=0)


@pytest.mark.parametrize("causal", [True, False])
def test_memory_run_equals_full_sequence_run(causal):
    attn = make(causal)
    seq = torch.randn(2, 7, DIM, dtype=torch.float64)
    with torch.no_grad():
        full = attn(seq, offset=2)
        segment = attn(seq[:, 4:], memory=seq[:, :4], offset=2)
    close(segment, full[:, 4:])


def test_causal_never_looks_ahead():
    attn = make(True)
    x = torch.randn(1, 6, DIM, dtype=torch.float64)
    memory = torch.randn(1, 3, DIM, dtype=torch.float64)
    changed = x.clone()
    changed[:, 4:] = torch.randn(1, 2, DIM, dtype=torch.float64)
    with torch.no_grad():
        a, b = attn(x, memory=memory), attn(changed, memory=memory)
    close(a[:, :4], b[:, :4])
    assert not torch.allclose(a[:, 4:], b[:, 4:])


def test_gradients_reach_w_r_u_v():
    attn = make(False)
    x = torch.randn(2, 4, DIM, dtype=torch.float64)
    attn(x, memory=torch.randn(2, 3, DIM, dtype=torch.float64)).square().sum().backward()
    enc = attn.encoding
    for name, p in [("W_R", enc.proj.weight), ("u", enc.u), ("v", enc.v)]:
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_registry_and_usage_errors():
    enc = build_encoding("xl", dim=16, heads=2, head_dim=8, causal=True, clamp_len="3")
    assert isinstance(enc, TransformerXLRelative) and enc.clamp_len == 3 and enc.causal
    assert enc.family == "relative" and enc.per_layer and not enc.uses_value
    assert sum(p.numel() for p in enc.parameters()) == 16 * 16 + 2 * 16  # W_R, u, v
    for bad in ({"dim": 7}, {"base": 1.0}, {"clamp_len": 0}):
        with pytest.raises(UsageError, match=next(iter(bad))):
            TransformerXLRelative(**bad)


@pytest.mark.parametrize("causal", [False, True])
def test_spread_positions_match_the_terms_written_out(causal):
    """Positions spread wider than the sequence (randomized positions) read each pair's distance
    by lookup (``table_products``): the bias of every visible pair, and the gradients of q, k,
    W_R, u and v, against (b) + (c) + (d) written out pair by pair."""
    enc = make(causal).encoding
    gen = torch.Generator().manual_seed(3)
    positions = torch.randperm(80, generator=gen)[:6].sort().values
    d = DIM // HEADS
    q, k = torch.randn(2, 3, HEADS, 6, d, dtype=torch.float64, generator=gen).unbind(0)
    q.requires_grad_(), k.requires_grad_()
    want = torch.zeros(3, HEADS, 6, 6, dtype=torch.float64)
    for i, pos_i in enumerate(positions.tolist()):
        for j, pos_j in enumerate(positions.tolist()):
            r = torch.tensor(r_vector(pos_i - pos_j, DIM, enc.base), dtype=torch.float64)
            wr_r = (enc.proj.weight @ r).view(HEADS, d)  # W_R R_{i-j}, per head
            terms = ((q[:, :, i] + enc.v) * wr_r).sum(-1) + (enc.u * k[:, :, j]).sum(-1)
            want[:, :, i, j] = terms / math.sqrt(d)
    got = enc.bias(q, k, positions, positions)
    visible = torch.ones(6, 6, dtype=torch.bool).tril() if causal else torch.ones(6, 6).bool()
    got, want = got[..., visible], want[..., visible]
    close(got, want)
    weights = torch.randn(want.shape, dtype=torch.float64, generator=gen)
    leaves = (q, k, enc.proj.weight, enc.u, enc.v)
    got_grads = torch.autograd.grad((got * weights).sum(), leaves)
    want_grads = torch.autograd.grad((want * weights).sum(), leaves)
    for a, b in zip(got_grads, want_grads, strict=True):
        close(a, b)

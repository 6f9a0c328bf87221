"""DeBERTa disentangled attention against the paper's eq. 4 written out pair by pair."""

from __future__ import annotations

import math

import pytest
import torch

from posenc_cli.encodings import build_encoding
from posenc_cli.encodings.deberta import (
    DebertaDisentangled,
    deberta_relative_positions,
    log_bucket_positions,
    relative_index,
)
from posenc_cli.errors import UsageError
from posenc_cli.models.attention import Attention

DIM, HEADS = 8, 2
HEAD_DIM = DIM // HEADS


def log_bucket_scalar(rel: int, bucket_size: int, max_position: int) -> int:
    """The published DeBERTa-v2 formula (make_log_bucket_position), one integer at a time."""
    sign = (rel > 0) - (rel < 0)
    mid = bucket_size // 2
    abs_pos = mid - 1 if -mid < rel < mid else abs(rel)
    if abs_pos <= mid:
        return rel
    log_pos = math.ceil(math.log(abs_pos / mid) / math.log((max_position - 1) / mid) * (mid - 1))
    return (log_pos + mid) * sign


def delta(a: int, b: int, k: int) -> int:
    """The paper's delta(a, b) (eq. 2) of an already bucketed distance a - b."""
    if a - b <= -k:
        return 0
    if a - b >= k:
        return 2 * k - 1
    return a - b + k


def make(causal: bool = False, seed: int = 0, **params) -> Attention:
    torch.manual_seed(seed)
    params = {"position_buckets": 4, "max_relative_positions": 8, **params}
    enc = DebertaDisentangled(dim=DIM, heads=HEADS, head_dim=HEAD_DIM, causal=causal, **params)
    attn = Attention(DIM, HEADS, enc, causal=causal).double()
    if enc.pos_query is not None:
        with torch.no_grad():  # the default bias init is small; make the p2c bias matter
            enc.pos_query.bias.normal_()
    return attn


def dense_reference(
    attn: Attention, x, memory=None, key_mask=None, offset: int = 0, positions=None
):
    """softmax((Qc.Kc + Qc.Kr[delta(i,j)] + Kc.Qr[delta(j,i)]) / sqrt((1+c2p+p2c) d)) Vc, with
    an explicit position vector for every pair; ``positions`` the keys' own, if given."""
    enc = attn.encoding
    H, d, span = attn.heads, attn.head_dim, enc.span
    context = x if memory is None else torch.cat([memory, x], dim=1)
    B, N, D = x.shape
    Nk = context.shape[1]
    q = attn.q(x).view(B, N, H, d)
    key, val = (t.reshape(B, Nk, H, d) for t in attn.kv(context).chunk(2, -1))
    pos_k = [offset + j for j in range(Nk)] if positions is None else positions.tolist()
    pos_q = pos_k[Nk - N :]

    def bucket(dist: int) -> int:
        if enc.position_buckets == 0:
            return dist
        return log_bucket_scalar(dist, enc.position_buckets, enc.max_relative_positions)

    P = enc.rel_embeddings
    k_r = torch.zeros(N, Nk, H, d, dtype=x.dtype)  # K^r_{delta(i,j)} for each pair
    q_r = torch.zeros(N, Nk, H, d, dtype=x.dtype)  # Q^r_{delta(j,i)} for each pair
    allowed = torch.ones(B, N, Nk, dtype=torch.bool)
    for i in range(N):
        for j in range(Nk):
            ij = delta(bucket(pos_q[i] - pos_k[j]), 0, span)
            ji = delta(bucket(pos_k[j] - pos_q[i]), 0, span)
            if enc.c2p:
                k_r[i, j] = (enc.pos_key.weight @ P[ij]).view(H, d)
            if enc.p2c:
                q_r[i, j] = (enc.pos_query.weight @ P[ji] + enc.pos_query.bias).view(H, d)
            for b in range(B):
                future = attn.causal and pos_k[j] > pos_q[i]
                padded = key_mask is not None and not key_mask[b, j]
                allowed[b, i, j] = not (future or padded)
    c2c = torch.einsum("bihd,bjhd->bhij", q, key)
    c2p = torch.einsum("bihd,ijhd->bhij", q, k_r)
    p2c = torch.einsum("bjhd,ijhd->bhij", key, q_r)
    scale = math.sqrt(d * (1 + enc.c2p + enc.p2c))
    logits = ((c2c + c2p + p2c) / scale).masked_fill(~allowed[:, None], float("-inf"))
    out = torch.einsum("bhij,bjhd->bihd", logits.softmax(-1), val)
    return attn.proj(out.reshape(B, N, D))


def test_log_bucket_matches_published_formula():
    rel = torch.arange(-1500, 1501)
    for buckets, max_pos in [(256, 512), (8, 16), (6, 40), (2, 5), (5, 9), (4, 8)]:
        got = log_bucket_positions(rel, buckets, max_pos)
        want = [log_bucket_scalar(r, buckets, max_pos) for r in rel.tolist()]
        assert got.tolist() == want, (buckets, max_pos)


def test_log_bucket_pinned_values():
    # Worked by hand: mid 128, ln(511/128) = 1.38434; 200 -> 128 + ceil(40.94), 1000 -> ceil(188.6)
    rel = torch.tensor([0, 5, -128, 128, 129, 200, 511, -511, 1000])
    got = log_bucket_positions(rel, 256, 512).tolist()
    assert got == [0, 5, -128, 128, 129, 169, 255, -255, 317]


def test_relative_positions_are_query_minus_key_and_index_is_delta():
    q_pos = torch.arange(3, 6)
    k_pos = torch.arange(0, 6)
    rel = deberta_relative_positions(q_pos, k_pos, 0, 2)
    assert rel.tolist() == [[qp - kp for kp in k_pos.tolist()] for qp in q_pos.tolist()]
    span = 2
    idx = relative_index(rel, span)
    want = [[delta(qp, kp, span) for kp in k_pos.tolist()] for qp in q_pos.tolist()]
    assert idx.tolist() == want
    bucketed = deberta_relative_positions(torch.tensor([0]), torch.tensor([0, 3, 30]), 4, 8)
    assert bucketed.tolist() == [[0, -3, -log_bucket_scalar(30, 4, 8)]]


CASES = {
    "both": dict(),
    "c2p_only": dict(p2c=False),
    "p2c_only": dict(c2p=False),
    "causal": dict(causal=True),
    "key_padding": dict(padding=True),
    "memory_offset": dict(memory=6, offset=3),
    "memory_causal": dict(memory=5, causal=True),
    "v1_clip": dict(position_buckets=0, max_relative_positions=3),
    "default_buckets": dict(position_buckets=256, max_relative_positions=512),
}


@pytest.mark.parametrize("name", list(CASES))
def test_matches_dense_reference(name):
    case = dict(CASES[name])
    padding = case.pop("padding", False)
    mem_len = case.pop("memory", 0)
    offset = case.pop("offset", 0)
    attn = make(**case)
    # 10 queries (+ memory) with 4 buckets / max 8: exact, log-spaced and clipped distances
    x = torch.randn(2, 10, DIM, dtype=torch.float64)
    memory = torch.randn(2, mem_len, DIM, dtype=torch.float64) if mem_len else None
    key_mask = None
    if padding:
        key_mask = torch.ones(2, 10, dtype=torch.bool)
        key_mask[0, 7:] = False
        key_mask[1, 3] = False
    got = attn(x, memory=memory, key_mask=key_mask, offset=offset)
    want = dense_reference(attn, x, memory, key_mask, offset)
    torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("buckets", [(4, 8), (256, 512)])
def test_causal_half_table_on_spread_positions_matches_dense_reference(buckets):
    """Positions spread wider than the sequence (randomized positions): every pair's window is
    the whole table, and a causal module reads only the half visible pairs use. Outputs and
    every parameter's gradient equal the reference's, which looks up each pair's row alone."""
    position_buckets, max_relative = buckets
    attn = make(causal=True, position_buckets=position_buckets, max_relative_positions=max_relative)
    x = torch.randn(2, 12, DIM, dtype=torch.float64)
    positions = torch.randperm(200, generator=torch.Generator().manual_seed(1))[:12].sort().values
    enc = attn.encoding
    widths = []
    term = enc.term

    def spy(x, proj, window, a_pos, b_pos, transposed=False):
        widths.append(window[1] - window[0] + 1)
        return term(x, proj, window, a_pos, b_pos, transposed)

    enc.term = spy
    grads = []
    for forward in (
        lambda: attn(x, positions=positions),
        lambda: dense_reference(attn, x, positions=positions),
    ):
        attn.zero_grad()
        out = forward()
        out.square().sum().backward()
        grads.append((out.detach(), [p.grad.clone() for p in attn.parameters()]))
    (got, got_grads), (want, want_grads) = grads
    torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-9)
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)
    (c_first, c_last), (p_first, p_last) = enc.windows(positions, positions, causal=True)
    assert c_first >= enc.span and p_last <= enc.span  # c2p rows from k on, p2c up to k
    assert widths == [c_last - c_first + 1, p_last - p_first + 1]
    two_sided = [last - first + 1 for first, last in enc.windows(positions, positions, False)]
    assert widths[0] < two_sided[0] and widths[1] < two_sided[1]


def test_p2c_reads_delta_j_i_as_the_paper_not_the_reference_code():
    enc = make(c2p=False, position_buckets=0, max_relative_positions=3).encoding
    pos = torch.arange(5)
    q = torch.randn(1, HEADS, 5, HEAD_DIM, dtype=torch.float64)
    k = torch.randn(1, HEADS, 5, HEAD_DIM, dtype=torch.float64)
    bias = enc.bias(q, k, pos, pos)[0]  # (H, N, N)
    q_r = enc.pos_query(enc.rel_embeddings).view(-1, HEADS, HEAD_DIM)  # (2k, H, d)
    i, j = 1, 3
    paper = (k[0, :, j] * q_r[delta(j, i, 3)]).sum(-1) * enc.logit_scale()
    code = (k[0, :, j] * q_r[delta(i, j, 3)]).sum(-1) * enc.logit_scale()
    torch.testing.assert_close(bias[:, i, j], paper)
    assert not torch.allclose(bias[:, i, j], code)


def test_switches_select_terms_and_scale():
    pos = torch.arange(6)
    q, k, q2, k2 = (torch.randn(1, HEADS, 6, HEAD_DIM, dtype=torch.float64) for _ in range(4))
    c2p = make(p2c=False).encoding
    p2c = make(c2p=False).encoding
    both = make().encoding
    torch.testing.assert_close(c2p.bias(q, k, pos, pos), c2p.bias(q, k2, pos, pos))  # no keys
    torch.testing.assert_close(p2c.bias(q, k, pos, pos), p2c.bias(q2, k, pos, pos))  # no queries
    assert not torch.allclose(c2p.bias(q, k, pos, pos), c2p.bias(q2, k, pos, pos))
    assert not torch.allclose(p2c.bias(q, k, pos, pos), p2c.bias(q, k2, pos, pos))
    assert c2p.pos_query is None and p2c.pos_key is None
    assert both.logit_scale() == pytest.approx(1 / math.sqrt(3 * HEAD_DIM))
    assert c2p.logit_scale() == pytest.approx(1 / math.sqrt(2 * HEAD_DIM))
    assert both.rel_embeddings.shape == (8, DIM)  # 2 * position_buckets rows
    assert make(position_buckets=0, max_relative_positions=5).encoding.rel_embeddings.shape == (
        10,
        DIM,
    )


def test_gradients_reach_every_parameter():
    attn = make()
    x = torch.randn(2, 7, DIM, dtype=torch.float64)
    (attn(x) * torch.randn_like(x)).sum().backward()
    named = dict(attn.encoding.named_parameters())
    assert set(named) == {"rel_embeddings", "pos_key.weight", "pos_query.weight", "pos_query.bias"}
    for name, p in named.items():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("causal", [False, True])
def test_depends_only_on_relative_positions(causal):
    attn = make(causal=causal)
    x = torch.randn(2, 9, DIM, dtype=torch.float64)
    memory = torch.randn(2, 4, DIM, dtype=torch.float64)
    torch.testing.assert_close(attn(x, memory=memory), attn(x, memory=memory, offset=37))
    enc = attn.encoding
    pos = torch.arange(9)
    q = torch.randn(1, HEADS, 9, HEAD_DIM, dtype=torch.float64)
    k = torch.randn(1, HEADS, 9, HEAD_DIM, dtype=torch.float64)
    torch.testing.assert_close(enc.bias(q, k, pos, pos), enc.bias(q, k, pos + 100, pos + 100))


def test_position_changes_the_output():
    torch.manual_seed(2)
    attn = make()
    x = torch.randn(1, 7, DIM, dtype=torch.float64)
    perm = torch.randperm(7)
    assert not torch.allclose(attn(x)[:, perm], attn(x[:, perm]))


def test_causal_never_looks_ahead():
    attn = make(causal=True)
    x = torch.randn(1, 8, DIM, dtype=torch.float64)
    changed = x.clone()
    changed[:, 5:] = torch.randn(1, 3, DIM, dtype=torch.float64)
    before, after = attn(x), attn(changed)
    torch.testing.assert_close(before[:, :5], after[:, :5])
    assert not torch.allclose(before[:, 5:], after[:, 5:])


def test_registry_and_errors():
    enc = build_encoding(
        "deberta", position_buckets="16", p2c="false", dim=DIM, heads=HEADS, head_dim=HEAD_DIM
    )
    assert isinstance(enc, DebertaDisentangled)
    assert enc.span == 16 and enc.pos_query is None and not enc.uses_value
    assert enc.per_layer and enc.family == "relative"
    with pytest.raises(UsageError, match="position_buckets"):
        DebertaDisentangled(position_buckets=1)
    with pytest.raises(UsageError, match="max_relative_positions"):
        DebertaDisentangled(position_buckets=256, max_relative_positions=100)
    with pytest.raises(UsageError, match="max_relative_positions"):
        DebertaDisentangled(position_buckets=0, max_relative_positions=0)
    with pytest.raises(UsageError, match="c2p and p2c"):
        DebertaDisentangled(c2p=False, p2c=False)


@pytest.mark.parametrize(
    "params",
    [{}, {"position_buckets": 8, "max_relative_positions": 12},
     {"position_buckets": 0, "max_relative_positions": 5}],
)  # fmt: skip
def test_table_rows_looked_up_by_difference_equal_the_formula_pair_by_pair(params):
    """delta(a, b) is a function of pos_a - pos_b: computed once per difference and looked up, it
    equals the paper's formula applied to every pair, over consecutive, offset (keys longer than
    queries) and sparse positions; sparse ones spread wider than the pairs take the formula."""
    enc = build_encoding("deberta", dim=32, heads=4, head_dim=8, **params)
    generator = torch.Generator().manual_seed(0)
    sparse = [torch.randperm(10**6, generator=generator)[:n].sort().values for n in (40, 30)]
    for a, b in [(torch.arange(300), torch.arange(300)), (torch.arange(20, 50), torch.arange(60)),
                 tuple(sparse)]:  # fmt: skip
        want = relative_index(
            deberta_relative_positions(a, b, enc.position_buckets, enc.max_relative_positions),
            enc.span,
        )
        assert torch.equal(enc.relative(a, b), want)
        assert torch.equal(enc.relative(b, a), enc.rows_of(b, a))

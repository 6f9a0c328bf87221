"""Shaw et al. 2018 relative positions against the paper's equations 3-4 written out densely."""

from __future__ import annotations

import math

import pytest
import torch

from posenc_cli.encodings import build_encoding
from posenc_cli.encodings.shaw import ShawRelative, shaw_buckets
from posenc_cli.errors import UsageError
from posenc_cli.models.attention import Attention

DIM, HEADS = 8, 2
HEAD_DIM = DIM // HEADS


def make(
    max_distance: int = 2,
    key: bool = True,
    value: bool = True,
    causal: bool = False,
    seed: int = 0,
) -> Attention:
    torch.manual_seed(seed)
    enc = ShawRelative(
        max_distance=max_distance, key=key, value=value, heads=HEADS, head_dim=HEAD_DIM
    )
    attn = Attention(DIM, HEADS, enc, causal=causal).double()
    with torch.no_grad():  # unit scale so the position terms are as large as the content ones
        for table in (enc.key_table, enc.value_table):
            if table is not None:
                table.normal_()
    return attn


def clip(x: int, k: int) -> int:
    return max(-k, min(k, x))


def dense_reference(attn: Attention, x, memory=None, key_mask=None, offset: int = 0):
    """Eq. 4 and eq. 3 with explicit (Nq, Nk, d) a^K_ij and a^V_ij built pair by pair."""
    enc = attn.encoding
    H, d, k = attn.heads, attn.head_dim, enc.max_distance
    context = x if memory is None else torch.cat([memory, x], dim=1)
    B, N, D = x.shape
    Nk = context.shape[1]
    q = attn.q(x).view(B, N, H, d).transpose(1, 2)  # (B, H, N, d)
    key, val = (t.reshape(B, Nk, H, d).transpose(1, 2) for t in attn.kv(context).chunk(2, -1))
    pos_q = [offset + Nk - N + i for i in range(N)]
    pos_k = [offset + j for j in range(Nk)]
    a_key = torch.zeros(N, Nk, d, dtype=x.dtype)
    a_val = torch.zeros(N, Nk, d, dtype=x.dtype)
    allowed = torch.ones(B, N, Nk, dtype=torch.bool)
    for i in range(N):
        for j in range(Nk):
            row = clip(pos_k[j] - pos_q[i], k) + k  # w index of clip(j - i, k)
            if enc.key_table is not None:
                a_key[i, j] = enc.key_table[row]
            if enc.value_table is not None:
                a_val[i, j] = enc.value_table[row]
            for b in range(B):
                future = attn.causal and pos_k[j] > pos_q[i]
                padded = key_mask is not None and not key_mask[b, j]
                allowed[b, i, j] = not (future or padded)
    e = (q[:, :, :, None, :] * (key[:, :, None, :, :] + a_key)).sum(-1) / math.sqrt(d)  # eq. 4
    e = e.masked_fill(~allowed[:, None], float("-inf"))
    alpha = e.softmax(-1)  # (B, H, N, Nk)
    z = (alpha[..., None] * (val[:, :, None, :, :] + a_val)).sum(-2)  # eq. 3, (B, H, N, d)
    return attn.proj(z.transpose(1, 2).reshape(B, N, D))


CASES = {
    "both": dict(),
    "key_only": dict(value=False),
    "value_only": dict(key=False),
    "causal": dict(causal=True),
    "key_padding": dict(padding=True),
    "memory": dict(memory=4),
    "memory_causal_offset": dict(memory=3, causal=True, offset=5),
    "k0": dict(max_distance=0),
    "k_large": dict(max_distance=20),
}


@pytest.mark.parametrize("name", list(CASES))
def test_matches_dense_reference(name):
    case = dict(CASES[name])
    padding = case.pop("padding", False)
    mem_len = case.pop("memory", 0)
    offset = case.pop("offset", 0)
    attn = make(**case)
    x = torch.randn(2, 9, DIM, dtype=torch.float64)
    memory = torch.randn(2, mem_len, DIM, dtype=torch.float64) if mem_len else None
    key_mask = None
    if padding:
        key_mask = torch.ones(2, 9, dtype=torch.bool)
        key_mask[0, 6:] = False
        key_mask[1, 2] = False
    got = attn(x, memory=memory, key_mask=key_mask, offset=offset)
    want = dense_reference(attn, x, memory, key_mask, offset)
    torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-9)


def test_buckets_are_clipped_key_minus_query():
    q_pos = torch.arange(5, 9)
    k_pos = torch.arange(0, 9)
    for k in (0, 1, 3):
        ids = shaw_buckets(q_pos, k_pos, k)
        assert ids.shape == (4, 9)
        for i, qp in enumerate(q_pos.tolist()):
            for j, kp in enumerate(k_pos.tolist()):
                assert ids[i, j] == clip(kp - qp, k) + k


def test_distances_beyond_k_share_one_embedding():
    attn = make(max_distance=2)
    enc = attn.encoding
    pos = torch.arange(10)
    q = torch.randn(1, HEADS, 10, HEAD_DIM, dtype=torch.float64)
    bias = enc.bias(q, q, pos, pos)[0, 0]  # (N, N)
    far_right = bias[0, 2:]  # j - i = 2 .. 9 all clip to +k
    far_left = bias[9, :8]  # j - i = -9 .. -2 all clip to -k
    torch.testing.assert_close(far_right, far_right[:1].expand_as(far_right))
    torch.testing.assert_close(far_left, far_left[:1].expand_as(far_left))
    inside = bias[4, 2:7]  # j - i = -2 .. 2: five different rows
    assert len(set(inside.tolist())) == 5


def test_key_term_depends_only_on_relative_position():
    enc = make(max_distance=3).encoding
    pos = torch.arange(8)
    same_q = torch.randn(1, HEADS, 1, HEAD_DIM, dtype=torch.float64).expand(1, HEADS, 8, HEAD_DIM)
    bias = enc.bias(same_q, same_q, pos, pos)[0]  # (H, N, N)
    torch.testing.assert_close(bias[:, 1:, 1:], bias[:, :-1, :-1])  # Toeplitz: only j - i
    assert not torch.allclose(bias[:, 0, 1], bias[:, 0, 2])  # and it does vary with j - i
    q = torch.randn(2, HEADS, 8, HEAD_DIM, dtype=torch.float64)
    k = torch.randn(2, HEADS, 8, HEAD_DIM, dtype=torch.float64)
    torch.testing.assert_close(enc.bias(q, k, pos, pos), enc.bias(q, k, pos + 13, pos + 13))


@pytest.mark.parametrize("causal", [False, True])
def test_attention_is_shift_invariant(causal):
    attn = make(max_distance=2, causal=causal)
    x = torch.randn(2, 7, DIM, dtype=torch.float64)
    memory = torch.randn(2, 3, DIM, dtype=torch.float64)
    torch.testing.assert_close(attn(x, memory=memory), attn(x, memory=memory, offset=11))


def test_causal_never_looks_ahead():
    attn = make(max_distance=2, causal=True)
    x = torch.randn(1, 8, DIM, dtype=torch.float64)
    changed = x.clone()
    changed[:, 5:] = torch.randn(1, 3, DIM, dtype=torch.float64)
    before, after = attn(x), attn(changed)
    torch.testing.assert_close(before[:, :5], after[:, :5])
    assert not torch.allclose(before[:, 5:], after[:, 5:])


def permutation_gap(attn: Attention) -> float:
    x = torch.randn(2, 7, DIM, dtype=torch.float64)
    perm = torch.randperm(7)
    return (attn(x)[:, perm] - attn(x[:, perm])).abs().max().item()


def test_k0_has_no_position_information():
    torch.manual_seed(1)
    assert permutation_gap(make(max_distance=0)) < 1e-12  # one bucket: equivariant
    assert permutation_gap(make(max_distance=2)) > 1e-3  # k > 0 sees order


def test_gradients_reach_both_tables():
    attn = make(max_distance=2)
    x = torch.randn(2, 6, DIM, dtype=torch.float64)
    (attn(x) * torch.randn_like(x)).sum().backward()
    enc = attn.encoding
    for table in (enc.key_table, enc.value_table):
        assert table.grad is not None and table.grad.abs().sum() > 0


def test_switches_and_paths():
    key_only = ShawRelative(value=False, heads=HEADS, head_dim=HEAD_DIM)
    assert not key_only.uses_value and key_only.value_table is None
    pos = torch.arange(3)
    assert key_only.value(torch.ones(1, HEADS, 3, 3), pos, pos) is None
    value_only = ShawRelative(key=False, heads=HEADS, head_dim=HEAD_DIM)
    assert value_only.uses_value and value_only.key_table is None
    q = torch.randn(1, HEADS, 3, HEAD_DIM)
    assert value_only.bias(q, q, pos, pos) is None
    assert value_only.value(torch.ones(1, HEADS, 3, 3), pos, pos).shape == (1, HEADS, 3, HEAD_DIM)
    assert ShawRelative(max_distance=4, head_dim=HEAD_DIM).key_table.shape == (9, HEAD_DIM)


def test_registry_and_errors():
    enc = build_encoding(
        "shaw", max_distance="3", key="false", dim=DIM, heads=HEADS, head_dim=HEAD_DIM
    )
    assert isinstance(enc, ShawRelative)
    assert enc.max_distance == 3 and enc.key_table is None and enc.uses_value
    assert enc.per_layer and enc.family == "relative"
    with pytest.raises(UsageError, match="max_distance"):
        ShawRelative(max_distance=-1)
    with pytest.raises(UsageError, match="key and value"):
        ShawRelative(key=False, value=False)

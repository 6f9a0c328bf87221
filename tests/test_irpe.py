"""iRPE (ImageRPE) against a dense float64 reference that builds every pair's embedding from the
official bucket ids and evaluates the paper's equations literally, through the real attention
module; plus multi-scale sums, 2D translation invariance, hand-checked offset signs, the window
hooks against the dense hooks, gradients, parameter counts and parameter errors."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import Tensor
from torch.testing import assert_close

from posenc_cli.encodings import irpe, irpe_index
from posenc_cli.encodings.base import grid_positions
from posenc_cli.encodings.irpe import ImageRPE
from posenc_cli.errors import UsageError
from posenc_cli.models.attention import Attention
from posenc_cli.models.window import slot_keys, slot_offsets

TIGHT = {"atol": 1e-9, "rtol": 1e-9}
DIM, HEADS, HEAD_DIM = 16, 2, 8
METHODS = ["euclidean", "quant", "cross", "product"]
ONS = ["k", "q", "v", "qk", "qkv"]


def rand(*shape: int, seed: int = 0) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def build(seed: int = 0, **params) -> ImageRPE:
    """A float64 encoding whose tables are random (the official zero init would hide terms)."""
    torch.manual_seed(seed)
    enc = ImageRPE(heads=HEADS, head_dim=HEAD_DIM, **params).double()
    for p in enc.parameters():
        torch.nn.init.normal_(p, std=0.5)
    return enc


def attention(enc: ImageRPE, seed: int = 1) -> Attention:
    torch.manual_seed(seed)
    return Attention(DIM, HEADS, enc).double()


def shifted(positions: Tensor, dr: int, dc: int) -> Tensor:
    """Move every grid token by (dr, dc); prefix tokens stay at (-1, -1)."""
    on_grid = positions[:, :1] >= 0
    return torch.where(on_grid, positions + torch.tensor([dr, dc]), positions)


# --- the dense reference ---------------------------------------------------------------------


def official_ids(enc: ImageRPE, height: int, width: int, prefix: int) -> list[Tensor]:
    """``(N, N)`` ids of every table (rows then cols for cross), from ``irpe_index.bucket_ids``
    (the official full-grid construction), not from the encoding's own lookup."""
    ids, _ = irpe_index.bucket_ids(enc.method, height, width, *enc.scales[0], prefix_tokens=prefix)
    maps = list(ids) if isinstance(ids, tuple) else [ids]
    if prefix:  # the official prefix id is the grid count, which is the encoding's last bucket
        assert all(int(m[0, 0]) == enc.counts[0] - 1 for m in maps)
    return maps


def pair_tables(enc: ImageRPE, letter: str, ids: list[Tensor]) -> list[Tensor]:
    """Every pair's own embedding ``(H|1, N, N, d)`` (or scalar ``(H|1, N, N)`` in bias mode),
    one per map, read entry by entry from the tables at ``ids``."""
    maps = ("rows", "cols") if enc.method == "cross" else ("",)
    out = []
    for m, idx in zip(maps, ids, strict=True):
        table = enc.tables[enc.table_name(letter, 0, m)]
        if enc.mode == "bias":
            out.append(table[:, idx])  # (H|1, N, N)
        elif letter == "v":
            out.append(table[:, idx, :])  # (H|1, N, N, d)
        else:
            out.append(table.transpose(1, 2)[:, idx, :])  # (H|1, d, nb) -> (H|1, N, N, d)
    return out


def dense_reference(att: Attention, x: Tensor, height: int, width: int, prefix: int) -> Tensor:
    """Wu et al. Eq. 14-15 with the official scale, s = 1/sqrt(d):
    e_ij = s q_i.k_j + s q_i.rK[b(i,j)] + s k_j.rQ[b(j,i)]  (bias mode: + bK[b(i,j)] + bQ[b(j,i)])
    z_i = sum_j a_ij (v_j + rV[b(i,j)])"""
    enc = att.encoding
    s = HEAD_DIM**-0.5
    q = att.split_heads(att.q(x))  # (B, H, N, d)
    k, v = (att.split_heads(t) for t in att.kv(x).chunk(2, -1))
    ids = official_ids(enc, height, width, prefix)
    logits = torch.einsum("bhid,bhjd->bhij", q, k) * s
    if "k" in enc.on:
        for r in pair_tables(enc, "k", ids):
            if enc.mode == "bias":
                logits = logits + r[None]
            else:
                logits = logits + s * torch.einsum(
                    "bhid,hijd->bhij", q, r.expand(HEADS, -1, -1, -1)
                )
    if "q" in enc.on:
        for r in pair_tables(enc, "q", [i.T.contiguous() for i in ids]):  # [i, j] = b(j, i)
            if enc.mode == "bias":
                logits = logits + r[None]
            else:
                logits = logits + s * torch.einsum(
                    "bhjd,hijd->bhij", k, r.expand(HEADS, -1, -1, -1)
                )
    attn = logits.softmax(-1)
    out = torch.einsum("bhij,bhjd->bhid", attn, v)
    if "v" in enc.on:
        for r in pair_tables(enc, "v", ids):
            out = out + torch.einsum("bhij,hijd->bhid", attn, r.expand(HEADS, -1, -1, -1))
    B, N = x.shape[:2]
    return att.proj(out.transpose(1, 2).reshape(B, N, DIM))


CASES = [
    (method, mode, on)
    for method, mode, on in itertools.product(METHODS, ["contextual", "bias"], ONS)
    if not (mode == "bias" and "v" in on)
]


@pytest.mark.parametrize("method,mode,on", CASES)
@pytest.mark.parametrize("shared_head", [True, False])
@pytest.mark.parametrize("height,width,prefix", [(3, 3, 1), (2, 4, 0), (4, 2, 2)])
def test_attention_equals_the_dense_equations(method, mode, on, shared_head, height, width, prefix):
    enc = build(method=method, mode=mode, on=on, shared_head=shared_head)
    att = attention(enc)
    pos = grid_positions(height, width, prefix)
    x = rand(2, len(pos), DIM)
    expected = dense_reference(att, x, height, width, prefix)
    assert_close(att(x, positions=pos), expected, **TIGHT)


@pytest.mark.parametrize("method,on", list(itertools.product(METHODS, ONS)))
@pytest.mark.parametrize("shared_head", [True, False])
def test_gradients_equal_the_dense_equations(method, on, shared_head):
    """Contextual terms take the hand-written backward (kernels/bucket_attention.py): every
    gradient, input and tables, against autograd through the dense equations."""
    enc = build(method=method, mode="contextual", on=on, shared_head=shared_head)
    att = attention(enc)
    pos = grid_positions(3, 4, 1)
    x = rand(2, len(pos), DIM).requires_grad_()
    weights = rand(2, len(pos), DIM, seed=5)
    params = [x, *att.parameters()]
    got = torch.autograd.grad((att(x, positions=pos) * weights).sum(), params)
    want = torch.autograd.grad((dense_reference(att, x, 3, 4, 1) * weights).sum(), params)
    for a, b in zip(got, want, strict=True):
        assert_close(a, b, **TIGHT)


def test_the_reference_sees_every_term():
    """Guard against a vacuous reference: each letter changes the output."""
    pos = grid_positions(3, 3, 1)
    x = rand(1, len(pos), DIM)
    torch.manual_seed(1)
    base = Attention(DIM, HEADS).double()(x, positions=pos)  # same weights as attention()
    for on in ["k", "q", "v"]:
        out = attention(build(on=on))(x, positions=pos)
        assert (out - base).abs().max() > 1e-3, on


# --- conventions pinned by hand ----------------------------------------------------------------


def test_offset_sign_and_the_transposed_query_bucket():
    """Product, ratio 1.9 (B = 3, side 7): query (0, 0), key (0, 1) is offset (0, -1), id
    (0+3)*7 + (-1+3) = 23 for keys; the query term reads the offset key - query, (0, +1), id 25."""
    pos = grid_positions(2, 2)
    q, k = rand(1, HEADS, 4, HEAD_DIM), rand(1, HEADS, 4, HEAD_DIM, seed=1)
    on_k = build(mode="bias", on="k")
    assert on_k.bias(q, k, pos, pos)[0, 0, 0, 1] == on_k.tables["k"][0, 23]
    on_q = build(mode="bias", on="q")
    assert on_q.bias(q, k, pos, pos)[0, 0, 0, 1] == on_q.tables["q"][0, 25]
    ctx = build(on="qk", shared_head=False)
    term = ctx.bias(q, k, pos, pos)[0, 1, 0, 1]
    expected = (q[0, 1, 0] @ ctx.tables["k"][1, :, 23] + k[0, 1, 1] @ ctx.tables["q"][1, :, 25]) * (
        HEAD_DIM**-0.5
    )
    assert_close(term, expected, **TIGHT)


def test_prefix_pairs_share_one_bucket_and_it_is_the_last():
    enc = build(mode="bias", on="k", shared_head=False)
    pos = grid_positions(3, 3, 2)
    q = k = rand(1, HEADS, len(pos), HEAD_DIM)
    b = enc.bias(q, k, pos, pos)[0]  # (H, N, N)
    last = enc.tables["k"][:, -1]  # (H,)
    prefix = (pos[:, None, 0] < 0) | (pos[None, :, 0] < 0)
    assert_close(b[:, prefix], last[:, None].expand(-1, int(prefix.sum())), **TIGHT)


def test_buckets_are_the_official_ids_and_counts():
    for method in METHODS:
        enc = build(method=method)
        pos = grid_positions(3, 5, 1)
        ids, count = enc.buckets(pos, pos)
        assert_close(ids, official_ids(enc, 3, 5, 1)[0])  # cross: the row ids
        assert count == (8 if method != "product" else 50)


# --- translation, subsets, caching -------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("on", ["qk", "qkv"])
def test_shifting_the_grid_changes_nothing(method, on):
    """Only offsets matter: the same tokens placed 2 rows down and 3 columns right (as a window
    of a larger grid would be) give the same attention output."""
    enc = build(method=method, on=on)
    att = attention(enc)
    pos = grid_positions(3, 4, 1)
    x = rand(2, len(pos), DIM)
    assert_close(att(x, positions=shifted(pos, 2, 3)), att(x, positions=pos), **TIGHT)


@pytest.mark.parametrize("mode", ["contextual", "bias"])
def test_equal_offsets_give_equal_bias_entries(mode):
    """Content-free check: with q = k = the same vector for every token, the term of a pair
    depends only on its 2D offset (a 5 x 5 grid has many pairs per offset)."""
    enc = build(method="product", mode=mode, on="qk")
    pos = grid_positions(5, 5)
    q = k = rand(1, HEADS, 1, HEAD_DIM).expand(-1, -1, len(pos), -1)
    b = enc.bias(q, k, pos, pos)[0, 0]  # (N, N)
    offsets = pos[:, None] - pos[None, :]  # (N, N, 2)
    seen: dict[tuple[int, int], Tensor] = {}
    for i, j in itertools.product(range(len(pos)), repeat=2):
        key = tuple(offsets[i, j].tolist())
        if key in seen:
            assert b[i, j] == seen[key]
        seen[key] = b[i, j]
    assert len(set(b.flatten().tolist())) > 5  # the terms do differ between offsets


@pytest.mark.parametrize("mode", ["contextual", "bias"])
def test_subsets_of_positions_give_the_dense_entries(mode):
    """Prefix queries against all keys, and patch queries against prefix keys, as the window
    path asks for them, are sub-blocks of the full bias and value."""
    enc = build(method="cross", mode=mode, on="qk" if mode == "bias" else "qkv")
    pos = grid_positions(3, 4, 2)
    q, k = rand(2, HEADS, len(pos), HEAD_DIM), rand(2, HEADS, len(pos), HEAD_DIM, seed=1)
    full = enc.bias(q, k, pos, pos)
    pre, grid = slice(0, 2), slice(2, None)
    assert_close(enc.bias(q[:, :, pre], k, pos[pre], pos), full[:, :, pre], **TIGHT)
    sub = enc.bias(q[:, :, grid], k[:, :, pre], pos[grid], pos[pre])
    assert_close(sub, full[:, :, grid, pre], **TIGHT)
    if enc.uses_value:
        attn = rand(2, HEADS, len(pos), len(pos), seed=2).softmax(-1)
        dense = enc.value(attn, pos, pos)
        part = enc.value(attn[:, :, grid, pre], pos[grid], pos[pre])
        zeroed = attn.clone()
        zeroed[:, :, :, grid] = 0
        assert_close(part, enc.value(zeroed, pos, pos)[:, :, grid], **TIGHT)
        assert dense.shape == (2, HEADS, len(pos), HEAD_DIM)


def test_the_id_cache_never_returns_stale_ids():
    """3 x 4 and 4 x 3 grids have the same number of tokens but different ids."""
    enc = build(method="product", mode="bias", on="k")
    wide, tall = grid_positions(3, 4), grid_positions(4, 3)
    q = k = rand(1, HEADS, 12, HEAD_DIM)
    first = enc.bias(q, k, wide, wide)
    second = enc.bias(q, k, tall, tall)
    fresh = build(method="product", mode="bias", on="k")
    assert_close(second, fresh.bias(q, k, tall, tall), **TIGHT)
    assert not torch.equal(first, second)
    assert_close(enc.bias(q, k, wide, wide), first, **TIGHT)


# --- multi-scale -------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["product", "cross"])
@pytest.mark.parametrize("mode,on", [("contextual", "qkv"), ("bias", "qk")])
def test_multi_scale_is_the_sum_of_the_single_scales(method, mode, on):
    multi = build(method=method, mode=mode, on=on, ratios=[1.9, 3.0])
    singles = [build(method=method, mode=mode, on=on, ratio=r) for r in (1.9, 3.0)]
    with torch.no_grad():
        for name, table in multi.tables.items():
            stem, scale = name.rsplit("_", 1)
            table.copy_(singles[int(scale)].tables[stem])
    pos = grid_positions(4, 5, 1)
    q, k = rand(2, HEADS, len(pos), HEAD_DIM), rand(2, HEADS, len(pos), HEAD_DIM, seed=1)
    summed = singles[0].bias(q, k, pos, pos) + singles[1].bias(q, k, pos, pos)
    assert_close(multi.bias(q, k, pos, pos), summed, **TIGHT)
    if multi.uses_value:
        attn = rand(2, HEADS, len(pos), len(pos), seed=2).softmax(-1)
        summed = singles[0].value(attn, pos, pos) + singles[1].value(attn, pos, pos)
        assert_close(multi.value(attn, pos, pos), summed, **TIGHT)
    assert multi.counts == [singles[0].counts[0], singles[1].counts[0]] != [50, 50]


# --- window hooks ------------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(
    "mode,on,shared_head",
    [("contextual", "qkv", True), ("contextual", "qkv", False), ("bias", "qk", False)],
)
def test_window_hooks_equal_the_dense_hooks_at_the_same_pairs(method, mode, on, shared_head):
    enc = build(method=method, mode=mode, on=on, shared_head=shared_head)
    height, width, window = 4, 5, 3
    pos = grid_positions(height, width)
    N = len(pos)
    q, k = rand(2, HEADS, N, HEAD_DIM), rand(2, HEADS, N, HEAD_DIM, seed=1)
    offsets = slot_offsets(window)  # (K, 2), query minus key
    keys = pos[:, None, :] - offsets[None]  # (N, K, 2): key = query - offset
    valid = ((keys >= 0) & (keys < torch.tensor([height, width]))).all(-1)  # (N, K) on the grid
    key_rows, key_cols = keys[..., 0].clamp(0, height - 1), keys[..., 1].clamp(0, width - 1)
    key_index = key_rows * width + key_cols  # (N, K), clamped where the slot is off the grid
    rows = torch.arange(N)[:, None].expand_as(key_index)

    dense = enc.bias(q, k, pos, pos).expand(2, HEADS, N, N)
    windowed = enc.window_bias(q, k, offsets, slot_keys(height, width, offsets))
    windowed = windowed.expand(2, HEADS, N, len(offsets))
    assert_close(windowed[..., valid], dense[:, :, rows, key_index][..., valid], **TIGHT)

    if enc.uses_value:
        attn_win = rand(2, HEADS, N, len(offsets), seed=2) * valid  # off-grid slots carry 0
        attn = torch.zeros(2, HEADS, N, N, dtype=torch.float64)
        attn[:, :, rows[valid], key_index[valid]] = attn_win[..., valid]
        assert_close(enc.window_value(attn_win, offsets), enc.value(attn, pos, pos), **TIGHT)


@pytest.mark.parametrize("method", ["product", "cross"])
def test_a_window_covering_the_grid_is_global_attention(method):
    """Window 7 on a 3 x 4 grid reaches every patch: with a class token this exercises every
    hook, the dense ones on prefix subsets included."""
    enc = build(method=method, on="qkv", shared_head=False)
    torch.manual_seed(1)
    windowed = Attention(DIM, HEADS, enc, window=7).double()
    full = attention(enc)
    full.load_state_dict(windowed.state_dict())
    pos = grid_positions(3, 4, 1)
    x = rand(2, len(pos), DIM)
    assert_close(windowed(x, positions=pos), full(x, positions=pos), **TIGHT)


# --- parameters, initialisation, gradients, errors ---------------------------------------------


def test_parameter_count_matches_the_official_deit_ti_increment():
    enc = ImageRPE(heads=3, head_dim=64)  # contextual product on keys, shared head: the default
    per_layer = sum(p.numel() for p in enc.parameters())
    assert per_layer == (7 * 7 + 1) * 64
    assert round(12 * per_layer / 1e6, 2) == 0.04  # DeiT-Ti 5.72M -> 5.76M
    per_head = ImageRPE(heads=3, head_dim=64, shared_head=False, on="qkv")
    assert sum(p.numel() for p in per_head.parameters()) == 3 * 3 * 50 * 64
    cross_bias = ImageRPE(heads=3, method="cross", mode="bias", on="qk")
    assert sum(p.numel() for p in cross_bias.parameters()) == 2 * 2 * (7 + 1)


def test_tables_start_at_zero_and_every_table_learns_from_there():
    """The official initialiser leaves the tables at zero; gradients still reach all of them,
    the prefix bucket included."""
    for method, mode, on in [(m, "contextual", "qkv") for m in METHODS] + [("cross", "bias", "qk")]:
        torch.manual_seed(0)
        enc = ImageRPE(heads=HEADS, head_dim=HEAD_DIM, method=method, mode=mode, on=on).double()
        assert all(p.abs().max() == 0 for p in enc.parameters())
        att = attention(enc)
        pos = grid_positions(3, 4, 1)
        att(rand(2, len(pos), DIM), positions=pos).square().sum().backward()
        for name, p in enc.named_parameters():
            assert p.grad is not None and p.grad.abs().sum() > 0, f"{method} {mode} {name}"
            # the bucket axis is the last one of q/k tables (H, d, nb), the middle one of v
            # (H, nb, d) and of bias tables (H, nb): its last entry is the prefix bucket
            prefix = p.grad[:, -1] if name.startswith("v") or mode == "bias" else p.grad[..., -1]
            assert prefix.abs().sum() > 0, f"{name}: the prefix bucket got no gradient"


def test_uses_value_follows_on_and_the_fused_path_is_kept_otherwise():
    assert build(on="qkv").uses_value and build(on="v").uses_value
    assert not build(on="qk").uses_value and not build(mode="bias", on="k").uses_value


def test_pure_functions_are_re_exported():
    assert irpe.piecewise_index is irpe_index.piecewise_index
    assert irpe.bucket_ids is irpe_index.bucket_ids
    assert {"piecewise_index", "bucket_ids", "ImageRPE"} <= set(irpe.__all__)


@pytest.mark.parametrize(
    "params,word",
    [
        ({"mode": "bias", "on": "qkv"}, "mode"),
        ({"mode": "bias", "on": "v"}, "contextual"),
        ({"ratios": []}, "ratios"),
        ({"ratios": [1.9, 3.0], "beta": 4.0}, "beta"),
        ({"ratios": [1.9, 3.0], "ratio": 2.5}, "ratios"),
        ({"ratios": [1.9, -1.0]}, "ratio"),
        ({"ratio": 0.0}, "ratio"),
        ({"alpha": 5.0}, "alpha"),  # alpha > beta = 3.8
        ({"gamma": 1.0}, "gamma"),  # gamma <= alpha = 1.9
        ({"method": "polar"}, "method"),
        ({"on": "kk"}, "on"),
        ({"mode": "absolute"}, "mode"),
    ],
)
def test_bad_parameters_are_one_line_usage_errors(params, word):
    with pytest.raises(UsageError) as err:
        ImageRPE(heads=HEADS, head_dim=HEAD_DIM, **params)
    assert word in str(err.value) and "\n" not in str(err.value)


def test_sequence_positions_are_a_usage_error():
    enc = build()
    q = rand(1, HEADS, 5, HEAD_DIM)
    with pytest.raises(UsageError, match="grid positions"):
        enc.bias(q, q, torch.arange(5), torch.arange(5))

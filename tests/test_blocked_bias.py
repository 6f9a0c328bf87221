"""The blocked content-free bias path against dense attention in float64: values, gradients of
q, k, v and of the encodings' own parameters, causal masks, memory keys, prefix tokens."""

from __future__ import annotations

import pytest
import torch

from posenc_cli.encodings import build_encoding, encoding_class
from posenc_cli.encodings.base import BackboneFacts, grid_positions
from posenc_cli.kernels import blocked_bias
from posenc_cli.kernels.visibility import Visibility
from posenc_cli.models.attention import Attention

ONE_D = ["alibi", "kerple", "sandwich", "fire", "t5"]
# FIRE past its threshold: every row its own normaliser, every block its own range of inputs
SETTINGS = {name: {} for name in ONE_D} | {"fire-past-threshold": {"threshold": 4.0}}


def dense(q, k, v, bias, q_pos, k_pos, scale, causal):
    logits = q @ k.transpose(-2, -1) * scale + bias
    if causal:
        logits = logits.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))
    return logits.softmax(-1) @ v


def qkv(heads, queries, keys, head_dim=8, batch=2):
    shapes = [(batch, heads, queries, head_dim)] + [(batch, heads, keys, head_dim)] * 2
    return [torch.randn(s, dtype=torch.float64, requires_grad=True) for s in shapes]


def same_results(out, grads, ref, ref_grads):
    """Two paths agree: outputs to 1e-12 and every gradient to 1e-11 (float64)."""
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-11)


def grads_of(out, inputs, seed):
    torch.manual_seed(seed)
    return torch.autograd.grad(out, inputs, torch.randn_like(out))


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("memory", [0, 7])
@pytest.mark.parametrize("tile", [blocked_bias.KEY_TILE, 5])
def test_kernel_equals_dense_attention(monkeypatch, setting, causal, memory, tile):
    """Tiles of 5 keys cut every block's keys into several tiles of the backward, the last
    shorter."""
    monkeypatch.setattr(blocked_bias, "KEY_TILE", tile)
    torch.manual_seed(0)
    name, params = setting.split("-")[0], SETTINGS[setting]
    enc = build_encoding(name, dim=32, heads=4, head_dim=8, causal=causal, **params).double()
    N = 45
    q, k, v = qkv(4, N, N + memory)
    k_pos = torch.arange(3, 3 + N + memory)  # not from 0: positions are used, not indices
    q_pos = k_pos[memory:]
    learned = [p for p in enc.parameters() if p.requires_grad]
    inputs = [q, k, v, *learned]
    out = blocked_bias.blocked_bias_attention(
        q,
        k,
        v,
        q_pos,
        k_pos,
        lambda _q, _k, r, c: enc.bias(q, k, r, c),
        learned,
        8**-0.5,
        causal,
        16,
    )
    ref = dense(q, k, v, enc.bias(q, k, q_pos, k_pos), q_pos, k_pos, 8**-0.5, causal)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    for got, want in zip(grads_of(out, inputs, 1), grads_of(ref, inputs, 1), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-11)


@pytest.mark.parametrize("name", ["alibi", "kerple", "sandwich", "t5"])
def test_distance_table_gives_the_encodings_own_bias(name):
    """The Toeplitz shortcut: a lookup of the bias at each distance is the bias itself."""
    enc = build_encoding(name, dim=32, heads=4, head_dim=8).double()
    assert enc.toeplitz
    q = torch.zeros(1, 4, 1, 8, dtype=torch.float64)
    k_pos = torch.arange(5, 60)
    q_pos = k_pos[10:]
    table, low = enc.distance_table(q, q_pos, k_pos)
    gather = blocked_bias.DistanceTable(table, low)
    assert table.shape == (4, (59 - 15) - (5 - 59) + 1) and low == 5 - 59
    rows, keys = q_pos[7:30], k_pos[2:50]
    torch.testing.assert_close(
        gather(None, None, rows, keys), enc.bias(q, q, rows, keys), rtol=0, atol=0
    )


def test_only_a_block_of_bias_is_ever_asked_for():
    """Memory linear in N: no call builds more than one block of queries."""
    enc = build_encoding("kerple", dim=32, heads=4, head_dim=8, causal=True).double()
    asked = []

    def bias_of_block(_q, _k, rows, keys):
        asked.append((len(rows), len(keys)))
        return enc.bias(q, k, rows, keys)

    q, k, v = qkv(4, 100, 100)
    pos = torch.arange(100)
    learned = list(enc.parameters())
    out = blocked_bias.blocked_bias_attention(
        q, k, v, pos, pos, bias_of_block, learned, 0.3, True, 32
    )
    out.sum().backward()
    assert max(rows for rows, _ in asked) == 32
    # causal: each block of consecutive positions sees the keys up to its own end only
    assert asked[:4] == [(32, 32), (32, 64), (32, 96), (4, 100)]


def route_blocked(monkeypatch, blocked: bool) -> list:
    """Send the module to the blocked kernel (blocks of 8) from any size, or never; returns the
    list that records each call of the kernel."""
    monkeypatch.setattr(blocked_bias, "MIN_PAIRS", 1 if blocked else 1 << 40)
    monkeypatch.setattr(blocked_bias, "CAUSAL_MIN_KEYS", 1 if blocked else 1 << 40)
    monkeypatch.setattr(blocked_bias, "BLOCK", 8)
    calls: list = []
    real = blocked_bias.blocked_bias_attention
    monkeypatch.setattr(
        blocked_bias, "blocked_bias_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw)
    )
    return calls


def two_d_attention(name, **params):
    facts = BackboneFacts(dim=32, heads=4, height=5, width=6, prefix_tokens=1)
    enc = encoding_class(name)(**facts.for_encoding(encoding_class(name), params))
    return Attention(32, 4, enc).double()


@pytest.mark.parametrize(
    "name, params",
    [("swin", {}), ("irpe", {"mode": "bias", "on": "qk"}), ("alibi", {}), ("kerple", {})],
)
def test_attention_module_takes_the_blocked_path_with_the_same_result(monkeypatch, name, params):
    torch.manual_seed(0)
    if name in ("swin", "irpe"):
        att = two_d_attention(name, **params)
        positions = grid_positions(5, 6, prefix=1)
    else:
        att = Attention(32, 4, build_encoding(name, dim=32, heads=4, head_dim=8)).double()
        # a gap in the positions: the blocks are gathered, not viewed
        positions = torch.cat([torch.arange(15), torch.arange(16) + 20])
    assert att.encoding.content_free
    x = torch.randn(2, 31, 32, dtype=torch.float64, requires_grad=True)
    inputs = [x, *att.parameters()]

    def run(blocked: bool):
        calls = route_blocked(monkeypatch, blocked)
        out = att(x, positions=positions)
        return out, grads_of(out, inputs, 2), bool(calls)

    fast, fast_grads, took = run(True)
    slow, slow_grads, took_slow = run(False)
    assert took and not took_slow
    same_results(fast, fast_grads, slow, slow_grads)


def test_contextual_irpe_is_not_content_free():
    enc = build_encoding("irpe", dim=32, heads=4, head_dim=8)
    assert not enc.content_free


def test_causal_module_path_with_memory_matches_dense(monkeypatch):
    """Keys longer than queries under a causal mask, through the module."""
    monkeypatch.setattr(blocked_bias, "CAUSAL_MIN_KEYS", 1)
    monkeypatch.setattr(blocked_bias, "BLOCK", 8)
    torch.manual_seed(0)
    enc = build_encoding("kerple", dim=32, heads=4, head_dim=8, causal=True)
    att = Attention(32, 4, enc, causal=True).double()
    x = torch.randn(2, 20, 32, dtype=torch.float64)
    memory = torch.randn(2, 9, 32, dtype=torch.float64)
    out = att(x, memory=memory)
    context = torch.cat([memory, x], 1)
    q = att.split_heads(att.q(x))
    k, v = (att.split_heads(t) for t in att.kv(context).chunk(2, -1))
    k_pos = torch.arange(29)
    ref = dense(q, k, v, enc.bias(q, k, k_pos[9:], k_pos), k_pos[9:], k_pos, 8**-0.5, True)
    torch.testing.assert_close(out, att.merge_heads(ref), rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "name, params",
    [
        ("xl", {}),
        ("deberta", {}),
        ("deberta", {"c2p": False}),
        ("deberta", {"p2c": False}),
        # log buckets and clipping inside 43 keys: the half tables' edge rows are read
        ("deberta", {"position_buckets": 8, "max_relative_positions": 12}),
    ],
)
@pytest.mark.parametrize("tile", [blocked_bias.KEY_TILE, 5])
def test_content_dependent_terms_block_by_block_equal_the_dense_path(
    monkeypatch, name, params, tile
):
    """XL's and DeBERTa's (i, j) terms read q_i and k_j: asked per block with that block's q and
    k (DeBERTa: its rows of q @ K^r and k @ Q^r), their outputs and all gradients (q, k through
    the bias too) equal the dense path's. DeBERTa's blocks go in tiles of keys (5: several per
    block), XL's whole."""
    monkeypatch.setattr(blocked_bias, "KEY_TILE", tile)
    torch.manual_seed(0)
    enc = build_encoding(name, dim=32, heads=4, head_dim=8, causal=True, **params)
    assert enc.pairwise_content and not enc.content_free
    att = Attention(32, 4, enc, causal=True).double()
    x = torch.randn(2, 37, 32, dtype=torch.float64, requires_grad=True)
    memory = torch.randn(2, 6, 32, dtype=torch.float64)
    inputs = [x, *att.parameters()]

    def run(blocked: bool):
        calls = route_blocked(monkeypatch, blocked)
        out = att(x, memory=memory)
        assert bool(calls) == blocked
        return out, grads_of(out, inputs, 3)

    fast, fast_grads = run(True)
    slow, slow_grads = run(False)
    same_results(fast, fast_grads, slow, slow_grads)


@pytest.mark.parametrize("name, projection", [("xl", "position_keys"), ("deberta", "per_head")])
def test_content_dependent_tables_are_projected_once_for_all_blocks(monkeypatch, name, projection):
    """XL's W_R R and DeBERTa's K^r, Q^r are the same for every block: a forward and backward
    over 5 blocks projects them once (XL one table, DeBERTa two), not once per block and again
    in the backward."""
    torch.manual_seed(0)
    enc = build_encoding(name, dim=32, heads=4, head_dim=8, causal=True)
    att = Attention(32, 4, enc, causal=True).double()
    calls = []
    real = getattr(enc, projection)
    monkeypatch.setattr(enc, projection, lambda *a: calls.append(1) or real(*a))
    route_blocked(monkeypatch, True)
    att(torch.randn(2, 37, 32, dtype=torch.float64)).sum().backward()
    assert len(calls) == (1 if name == "xl" else 2)


@pytest.mark.parametrize("causal, widths", [(True, (8, 9)), (False, (16, 16))])
def test_causal_deberta_multiplies_only_the_half_of_its_table_visible_pairs_read(causal, widths):
    """Under a causal mask a visible pair has ``i - j >= 0``: c2p reads table rows k..2k-1 and
    p2c rows 0..k, so q and k are multiplied by those rows alone (k = 8 here); without a mask,
    by all 2k."""
    torch.manual_seed(0)
    enc = build_encoding(
        "deberta", dim=32, heads=4, head_dim=8, causal=causal, position_buckets=8,
        max_relative_positions=12,
    )  # fmt: skip
    q, k = torch.randn(2, 2, 4, 30, 8).unbind(0)
    positions = torch.arange(30)
    _, _, (c2p, p2c) = enc.bias_by_block(q, k, positions, positions, causal=causal)
    assert (c2p.shape[-1], p2c.shape[-1]) == widths


@pytest.mark.parametrize(
    "causal, offset, widths", [(False, 0, (9, 9)), (True, 0, (5, 5)), (True, 100, (5, 5))]
)
def test_deberta_multiplies_only_the_table_rows_its_pairs_read(causal, offset, widths):
    """5 tokens have distances -4..4: of v2's 512 rows (k = 256) they read 252..260, so q and k
    are multiplied by those 9 (under a causal mask c2p's 256..260 and p2c's 252..256), wherever
    the sequence starts; the bias equals the one gathered from the whole table."""
    torch.manual_seed(0)
    enc = build_encoding("deberta", dim=32, heads=4, head_dim=8, causal=causal).double()
    q, k = torch.randn(2, 2, 4, 5, 8, dtype=torch.float64).unbind(0)
    positions = torch.arange(5) + offset
    _, _, (c2p, p2c) = enc.bias_by_block(q, k, positions, positions, causal=causal)
    assert (c2p.shape[-1], p2c.shape[-1]) == widths
    whole = (0, 2 * enc.span - 1)
    want = enc.gathered(*enc.per_bucket(q, k, (whole, whole)), positions, positions, (whole,) * 2)
    torch.testing.assert_close(enc.bias(q, k, positions, positions), want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["xl", "deberta"])
@pytest.mark.parametrize("frozen", [False, True])
def test_blocks_add_their_own_gradients_unless_a_leaf_is_frozen(monkeypatch, name, frozen):
    """XL's and DeBERTa's blocks give their gradients by hand (a scatter of dS; for XL into the
    relative shift's skewed layout), asking autograd for no block. With one of XL's leaves
    frozen (u) its blocks go through autograd; DeBERTa has no leaves of its own (its table
    reaches autograd through the two products), so it stays by hand. Either way the output and
    every gradient equal the dense path's."""
    torch.manual_seed(0)
    enc = build_encoding(name, dim=32, heads=4, head_dim=8, causal=True)
    att = Attention(32, 4, enc, causal=True).double()
    if frozen:
        (enc.u if name == "xl" else enc.rel_embeddings).requires_grad_(False)
    x = torch.randn(2, 37, 32, dtype=torch.float64, requires_grad=True)
    inputs = [x, *(p for p in att.parameters() if p.requires_grad)]
    calls = []
    real = torch.autograd.grad
    monkeypatch.setattr(
        blocked_bias.torch.autograd, "grad", lambda *a, **k: calls.append(1) or real(*a, **k)
    )

    def run(blocked: bool):
        routed = route_blocked(monkeypatch, blocked)
        out = att(x)
        for t in inputs:
            t.grad = None
        out.backward(torch.randn_like(out, generator=torch.Generator().manual_seed(3)))
        assert bool(routed) == blocked
        return out, [t.grad for t in inputs]

    fast, fast_grads = run(True)
    assert bool(calls) == (frozen and name == "xl")
    slow, slow_grads = run(False)
    same_results(fast, fast_grads, slow, slow_grads)


def test_sparse_positions_skip_the_distance_table(monkeypatch):
    """Sorted random positions spread over a wide range (randomized positions): the blocks ask
    the encoding itself, and the result still equals the dense path."""
    torch.manual_seed(0)
    att = Attention(32, 4, build_encoding("kerple", dim=32, heads=4, head_dim=8, causal=True),
                    causal=True).double()  # fmt: skip
    positions = torch.randperm(100_000)[:40].sort().values
    x = torch.randn(2, 40, 32, dtype=torch.float64)
    monkeypatch.setattr(
        att.encoding, "distance_table", lambda *a: pytest.fail("a table over 100,000 distances")
    )
    route_blocked(monkeypatch, True)
    fast = att(x, positions=positions)
    route_blocked(monkeypatch, False)
    torch.testing.assert_close(fast, att(x, positions=positions), rtol=0, atol=1e-12)


def test_flipped_block_is_the_gathered_block_reversed_read_in_place():
    """The view the flash kernel takes: the same numbers as the gather, rows reversed, and no
    memory of its own (it lies in the table's storage)."""
    torch.manual_seed(0)
    table, low = torch.randn(4, 200, dtype=torch.float64), -120
    lookup = blocked_bias.DistanceTable(table, low)
    rows, keys = torch.arange(30, 47), torch.arange(5, 70)
    view = lookup.flipped(rows, keys, Visibility(), torch.float64)
    torch.testing.assert_close(view, lookup(None, None, rows, keys).flip(-2), rtol=0, atol=0)
    assert view.untyped_storage().data_ptr() == table.untyped_storage().data_ptr()
    masked = lookup.flipped(rows, keys, Visibility(causal=True), torch.float64).flip(-2)
    ahead = keys[None, :] > rows[:, None]
    assert (masked[0][:, ahead] == torch.finfo(torch.float64).min).all()
    torch.testing.assert_close(masked[0][:, ~ahead], view.flip(-2)[0][:, ~ahead], rtol=0, atol=0)


@pytest.mark.parametrize("name", ["alibi", "kerple", "sandwich", "t5"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("memory", [0, 7])
@pytest.mark.parametrize("tile", [blocked_bias.KEY_TILE, 5])
def test_distance_table_kernel_equals_dense_attention(monkeypatch, name, causal, memory, tile):
    """Over consecutive positions the blocks read the table as a view; learned tables still get
    their gradient (the diagonal sums of dS, block by block and, with tiles of 5, tile by
    tile)."""
    monkeypatch.setattr(blocked_bias, "KEY_TILE", tile)
    torch.manual_seed(0)
    enc = build_encoding(name, dim=32, heads=4, head_dim=8, causal=causal).double()
    N = 45
    q, k, v = qkv(4, N, N + memory)
    k_pos = torch.arange(3, 3 + N + memory)
    q_pos = k_pos[memory:]
    table, low = enc.distance_table(q, q_pos, k_pos)
    learned = [table] if table.requires_grad else []
    params = [p for p in enc.parameters() if p.requires_grad]
    out = blocked_bias.blocked_bias_attention(
        q, k, v, q_pos, k_pos, blocked_bias.DistanceTable(table, low), learned, 8**-0.5, causal,
        16,
    )  # fmt: skip
    ref = dense(q, k, v, enc.bias(q, k, q_pos, k_pos), q_pos, k_pos, 8**-0.5, causal)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    inputs = [q, k, v, *params]
    for got, want in zip(grads_of(out, inputs, 1), grads_of(ref, inputs, 1), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-11)


@pytest.mark.parametrize("causal", [True, False])
def test_a_fixed_distance_table_is_never_gathered(monkeypatch, causal):
    """Sandwich learns nothing: forward and backward take the view, so no block is built."""
    enc = build_encoding("sandwich", dim=32, heads=4, head_dim=8, causal=causal).double()
    monkeypatch.setattr(
        blocked_bias.DistanceTable, "__call__", lambda *a: pytest.fail("a block was gathered")
    )
    q, k, v = qkv(4, 40, 40)
    pos = torch.arange(40)
    table, low = enc.distance_table(q, pos, pos)
    out = blocked_bias.blocked_bias_attention(
        q, k, v, pos, pos, blocked_bias.DistanceTable(table, low), [], 0.3, causal, 16
    )
    out.sum().backward()
    ref = dense(q, k, v, enc.bias(q, k, pos, pos), pos, pos, 0.3, causal)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["alibi", "sandwich", "kerple"])
@pytest.mark.parametrize("causal", [False, True])
def test_the_module_reads_the_distance_table_over_consecutive_positions(monkeypatch, name, causal):
    torch.manual_seed(1)
    enc = build_encoding(name, dim=32, heads=4, head_dim=8, causal=causal)
    att = Attention(32, 4, enc, causal=causal).double()
    x = torch.randn(2, 20, 32, dtype=torch.float64, requires_grad=True)
    inputs = [x, *att.parameters()]
    viewed = []
    real = blocked_bias.DistanceTable.flipped
    monkeypatch.setattr(
        blocked_bias.DistanceTable, "flipped", lambda *a: viewed.append(1) or real(*a)
    )

    def run(blocked: bool):
        calls = route_blocked(monkeypatch, blocked)
        out = att(x, offset=5)  # positions 5 .. 24: still consecutive
        return out, grads_of(out, inputs, 2), bool(calls)

    fast, fast_grads, took = run(True)
    slow, slow_grads, took_slow = run(False)
    assert took and viewed and not took_slow
    same_results(fast, fast_grads, slow, slow_grads)


def test_float32_alibi_over_a_long_input_keeps_the_dense_paths_precision():
    """The view holds the same float32 numbers as the dense bias, so the error stays the dense
    float32 path's own (about 5e-7 here) at 4096 tokens and the steepest 8-head slope."""
    torch.manual_seed(0)
    enc = build_encoding("alibi", dim=16, heads=1, head_dim=16)
    enc.slopes = [0.5]
    q, k, v = (torch.randn(1, 1, 4096, 16) for _ in range(3))
    pos = torch.arange(4096)
    for causal in (False, True):
        table, low = enc.distance_table(q, pos, pos)
        got = blocked_bias.blocked_bias_attention(
            q, k, v, pos, pos, blocked_bias.DistanceTable(table, low), [], 0.25, causal
        )
        bias = enc.bias(q.double(), k.double(), pos, pos)
        want = dense(q.double(), k.double(), v.double(), bias, pos, pos, 0.25, causal)
        assert (got.double() - want).abs().max() < 2e-6


def test_a_leaf_the_table_was_computed_from_gets_its_gradient_through_autograd():
    """``leaves`` may be any tensors the table comes from (here ALiBi-like slopes): only the
    table itself takes the diagonal sums."""
    torch.manual_seed(0)
    slope = torch.tensor([0.5, 0.25, 0.125, 0.0625], dtype=torch.float64, requires_grad=True)
    q, k, v = qkv(4, 30, 30)
    pos = torch.arange(30)
    distances = torch.arange(-29, 30, dtype=torch.float64)
    table = -slope[:, None] * distances.abs()
    out = blocked_bias.blocked_bias_attention(
        q, k, v, pos, pos, blocked_bias.DistanceTable(table, -29), [slope], 0.3, True, 8
    )
    bias = (-slope[:, None, None] * (pos[None, :] - pos[:, None]).abs())[None]
    ref = dense(q, k, v, bias, pos, pos, 0.3, True)
    for got, want in zip(grads_of(out, [q, slope], 1), grads_of(ref, [q, slope], 1), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-11)


@pytest.mark.parametrize("causal", [True, False])
def test_fixed_table_gradients_equal_the_dense_ones(causal):
    enc = build_encoding("sandwich", dim=32, heads=4, head_dim=8, causal=causal).double()
    q, k, v = qkv(4, 40, 47)
    k_pos = torch.arange(47)
    q_pos = k_pos[7:]
    table, low = enc.distance_table(q, q_pos, k_pos)
    out = blocked_bias.blocked_bias_attention(
        q, k, v, q_pos, k_pos, blocked_bias.DistanceTable(table, low), [], 0.3, causal, 16
    )
    ref = dense(q, k, v, enc.bias(q, k, q_pos, k_pos), q_pos, k_pos, 0.3, causal)
    for got, want in zip(grads_of(out, [q, k, v], 1), grads_of(ref, [q, k, v], 1), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-11)


def test_t5_without_gradients_reads_its_table_as_a_view(monkeypatch):
    torch.manual_seed(0)
    enc = build_encoding("t5", dim=32, heads=4, head_dim=8)
    torch.nn.init.normal_(enc.table.weight)
    att = Attention(32, 4, enc).double()
    x = torch.randn(2, 40, 32, dtype=torch.float64)
    viewed = []
    real = blocked_bias.DistanceTable.flipped
    monkeypatch.setattr(
        blocked_bias.DistanceTable, "flipped", lambda *a: viewed.append(1) or real(*a)
    )
    with torch.no_grad():
        route_blocked(monkeypatch, True)
        fast = att(x)
        route_blocked(monkeypatch, False)
        slow = att(x)
    assert viewed
    torch.testing.assert_close(fast, slow, rtol=0, atol=1e-12)


def test_weights_below_float32s_normal_range_are_floored_not_lost():
    """exp of a masked pair's minimum would leave the vectorised path; the weights are floored at
    exp(-87) instead, 1.6e-38, and every weight above that is exp itself."""
    from posenc_cli.kernels.biased_sdpa import probabilities_

    shifted = torch.tensor([0.0, -3.5, -87.0, -100.0, torch.finfo(torch.float32).min])
    got = probabilities_(shifted.clone())
    torch.testing.assert_close(got[:3], shifted[:3].exp(), atol=0, rtol=0)
    assert (got[3:] == got[2]).all() and got[2] < 1.7e-38

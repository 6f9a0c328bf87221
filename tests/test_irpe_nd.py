"""irpe_nd (iRPE on any number of axes) against literal references: a pure-Python piecewise
index and per-pair loop for the ids, the paper's equations evaluated densely in float64 through
the real attention module on a video grid and a mixed text + image sequence, and ``irpe``
itself at two axes, id for id and output for output."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import Tensor
from torch.testing import assert_close

from posenc_cli.encodings import build_encoding
from posenc_cli.encodings.base import grid_positions
from posenc_cli.encodings.irpe import ImageRPE
from posenc_cli.encodings.irpe_nd import RelativeND
from posenc_cli.encodings.mrope import mrope_positions
from posenc_cli.errors import UsageError
from posenc_cli.models.attention import Attention

TIGHT = {"atol": 1e-9, "rtol": 1e-9}
DIM, HEADS, HEAD_DIM = 16, 2, 8
METHODS = ["euclidean", "quant", "cross", "product"]
ALPHA, BETA, GAMMA = 1.9, 3.8, 15.2  # the default ratio 1.9 as 1 : 2 : 8


def literal_g(x: float) -> int:
    """Eq. 18 in plain Python: exact up to alpha, logarithmic to the cap int(beta)."""
    if abs(x) <= ALPHA:
        return round(x)
    far = ALPHA + math.log(abs(x) / ALPHA) / math.log(GAMMA / ALPHA) * (BETA - ALPHA)
    return int(math.copysign(min(round(far), BETA), x))


def literal_ids(method: str, offset: tuple[int, ...]) -> list[int]:
    """The ids of one offset (query minus key), one per axis for cross."""
    B, side = int(BETA), 2 * int(BETA) + 1
    squared = sum(o * o for o in offset)
    if method == "euclidean":
        return [literal_g(round(math.sqrt(squared))) + B]
    if method == "quant":
        return [literal_g(squared) + B]
    digits = [literal_g(o) + B for o in offset]
    if method == "cross":
        return digits
    return [sum(d * side ** (len(offset) - 1 - a) for a, d in enumerate(digits))]


def video_positions(frames: int, height: int, width: int, prefix: int = 0) -> Tensor:
    """(t, row, col) of a clip in frame-major order, prefix tokens at -1 on every axis."""
    cells = list(itertools.product(range(frames), range(height), range(width)))
    return torch.tensor([[-1, -1, -1]] * prefix + cells, dtype=torch.long)


def build(seed: int = 0, **params) -> RelativeND:
    """A float64 encoding with random tables (the zero init would hide every term)."""
    torch.manual_seed(seed)
    enc = RelativeND(heads=HEADS, head_dim=HEAD_DIM, **params).double()
    for p in enc.parameters():
        torch.nn.init.normal_(p, std=0.5)
    return enc


def rand(*shape: int, seed: int = 0) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def pair_ids(enc: RelativeND, positions: Tensor) -> list[list[list[int]]]:
    """Per map, the id of every pair by a literal loop; a prefix token on either side reads the
    last bucket."""
    coords = positions[:, None].expand(-1, enc.axes) if positions.dim() == 1 else positions
    rows = [tuple(c) for c in coords.tolist()]
    n_maps = enc.axes if enc.method == "cross" else 1
    out = [[[0] * len(rows) for _ in rows] for _ in range(n_maps)]
    for (i, a), (j, b) in itertools.product(enumerate(rows), repeat=2):
        if a[0] < 0 or b[0] < 0:
            ids = [enc.counts[0] - 1] * n_maps
        else:
            ids = literal_ids(enc.method, tuple(x - y for x, y in zip(a, b, strict=True)))
        for m in range(n_maps):
            out[m][i][j] = ids[m]
    return out


def dense_reference(att: Attention, x: Tensor, positions: Tensor) -> Tensor:
    """iRPE's Eq. 14-15 with every pair's table entry looked up by the literal ids."""
    enc: RelativeND = att.encoding
    s = HEAD_DIM**-0.5
    q = att.split_heads(att.q(x))
    k, v = (att.split_heads(t) for t in att.kv(x).chunk(2, -1))
    maps = enc.maps
    ids = [torch.tensor(m) for m in pair_ids(enc, positions)]

    def per_pair(letter: str, idx: Tensor) -> list[Tensor]:
        tables = [enc.tables[enc.table_name(letter, 0, m)] for m in maps]
        if enc.mode == "bias":
            return [t[:, i] for t, i in zip(tables, idx, strict=True)]  # (H|1, N, N)
        if letter == "v":
            return [t[:, i, :].expand(HEADS, -1, -1, -1) for t, i in zip(tables, idx, strict=True)]
        return [t.transpose(1, 2)[:, i, :].expand(HEADS, -1, -1, -1)
                for t, i in zip(tables, idx, strict=True)]  # fmt: skip

    logits = torch.einsum("bhid,bhjd->bhij", q, k) * s
    if "k" in enc.on:
        for r in per_pair("k", ids):
            logits = logits + (r[None] if enc.mode == "bias" else s * torch.einsum(
                "bhid,hijd->bhij", q, r))  # fmt: skip
    if "q" in enc.on:
        for r in per_pair("q", [i.T for i in ids]):  # the query term reads b(j, i)
            logits = logits + (r[None] if enc.mode == "bias" else s * torch.einsum(
                "bhjd,hijd->bhij", k, r))  # fmt: skip
    attn = logits.softmax(-1)
    out = torch.einsum("bhij,bhjd->bhid", attn, v)
    if "v" in enc.on:
        for r in per_pair("v", ids):
            out = out + torch.einsum("bhij,hijd->bhid", attn, r)
    B, N = x.shape[:2]
    return att.proj(out.transpose(1, 2).reshape(B, N, DIM))


# --- ids ---------------------------------------------------------------------------------------


def test_one_axis_is_the_1d_piecewise_index():
    """Offsets -5..5 at ratio 1.9 (worked by hand: g = -3 -3 -2 -2 -1 0 1 2 2 3 3, plus B = 3)."""
    enc = RelativeND(axes=1, method="product", heads=HEADS, head_dim=HEAD_DIM)
    ids = enc.map_ids(torch.tensor([5]), torch.arange(10, -1, -1))[0]  # query 5 minus key
    assert ids[0].tolist() == [0, 0, 1, 1, 2, 3, 4, 5, 5, 6, 6]
    assert enc.counts == [7 + 1]


def test_three_axis_ids_worked_by_hand():
    """Offset (1, -2, 4): product digits (4, 1, 6) -> 4 * 49 + 1 * 7 + 6 = 209; cross the three
    digits; euclidean and quant g(round(sqrt 21)) = g(5) = 3 and g(21) = 3, plus 3."""
    q, k = torch.tensor([[1, 0, 4]]), torch.tensor([[0, 2, 0]])
    got = {m: [int(i) for i in RelativeND(method=m).map_ids(q, k)] for m in METHODS}
    assert got == {"product": [209], "cross": [4, 1, 6], "euclidean": [6], "quant": [6]}
    assert RelativeND(method="product").counts == [7**3 + 1]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("axes,positions", [
    (1, torch.tensor([-1, 0, 3, 9, 30])),
    (2, grid_positions(3, 5, prefix=1)),
    (3, video_positions(3, 2, 4, prefix=1)),
    (3, torch.tensor([-1, 0, 1, 2, 5, 9])),  # text on every axis: its box dwarfs its pairs
])  # fmt: skip
def test_ids_equal_a_literal_loop(method, axes, positions):
    enc = RelativeND(axes=axes, method=method)
    assert [t.tolist() for t in enc.map_ids(positions, positions)] == pair_ids(enc, positions)


def test_long_text_on_three_axes_reads_its_pairs_not_the_cube_of_its_span():
    # 600 tokens at (i, i, i) span a box of 1199^3 offsets (41 GB of coordinates); their
    # 600 x 600 pairs lie on its diagonal
    ids = RelativeND(axes=3, method="product").map_ids(torch.arange(600), torch.arange(600))
    assert ids[0].shape == (600, 600)
    assert ids[0][0, 1] == ids[0][1, 2] != ids[0][1, 0]  # offset -1 once, +1 elsewhere


def test_sequence_positions_sit_at_that_value_on_every_axis():
    enc = RelativeND(axes=3, method="product")
    seq = torch.arange(6)
    spread = seq[:, None].expand(-1, 3)
    pairs = zip(enc.map_ids(seq, seq), enc.map_ids(spread, spread), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


# --- the equations, through the attention module ----------------------------------------------

CASES = [
    (method, mode, on)
    for method, mode, on in itertools.product(METHODS, ["contextual", "bias"], ["k", "qk", "qkv"])
    if not (mode == "bias" and "v" in on)
]


@pytest.mark.parametrize("method,mode,on", CASES)
def test_video_attention_equals_the_dense_equations(method, mode, on):
    att = Attention(DIM, HEADS, build(method=method, mode=mode, on=on, shared_head=False)).double()
    pos = video_positions(3, 2, 3, prefix=1)
    x = rand(2, len(pos), DIM)
    assert_close(att(x, positions=pos), dense_reference(att, x, pos), **TIGHT)


@pytest.mark.parametrize("method", METHODS)
def test_text_and_an_image_share_one_sequence(method):
    """A caption, a 2 x 3 x 3 clip and more text, at M-RoPE's positions (Qwen2-VL's rule)."""
    att = Attention(DIM, HEADS, build(method=method, on="qkv")).double()
    pos = mrope_positions([("text", 3), ("image", 2, 3, 3), ("text", 2)])
    x = rand(1, len(pos), DIM)
    assert_close(att(x, positions=pos), dense_reference(att, x, pos), **TIGHT)


def test_gradients_reach_every_table():
    att = Attention(DIM, HEADS, build(method="cross", on="qkv")).double()
    pos = video_positions(2, 3, 3)
    att(rand(1, len(pos), DIM), positions=pos).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in att.encoding.parameters())


# --- two axes are irpe ---------------------------------------------------------------------------


def as_irpe_name(name: str) -> str:
    return name.replace("_axis0", "_rows").replace("_axis1", "_cols")


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("mode,on", [("bias", "qk"), ("contextual", "qkv"), ("contextual", "k")])
def test_two_axes_give_irpe_ids_and_outputs(method, mode, on):
    nd = build(axes=2, method=method, mode=mode, on=on, ratios=[1.9, 3.0])
    image = ImageRPE(heads=HEADS, head_dim=HEAD_DIM, method=method, mode=mode, on=on,
                     ratios=[1.9, 3.0]).double()  # fmt: skip
    image.load_state_dict({as_irpe_name(k): v for k, v in nd.state_dict().items()})
    pos = grid_positions(3, 4, prefix=1)
    assert all(torch.equal(a, b) for a, b in zip(
        nd.map_ids(pos, pos), image.map_ids(pos, pos), strict=True))  # fmt: skip
    torch.manual_seed(3)
    a, b = Attention(DIM, HEADS, nd).double(), Attention(DIM, HEADS, image).double()
    b.load_state_dict({as_irpe_name(k): v for k, v in a.state_dict().items()})
    x = rand(2, len(pos), DIM)
    assert_close(a(x, positions=pos), b(x, positions=pos), **TIGHT)
    offsets = torch.tensor([[0, 0], [1, -2], [-3, 3]])
    assert all(torch.equal(s, t) for s, t in zip(
        nd.slot_bucket_ids(offsets), image.slot_bucket_ids(offsets), strict=True))  # fmt: skip


# --- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize("axes", [0, 5])
def test_axes_out_of_range_is_a_usage_error(axes):
    with pytest.raises(UsageError, match="axes must be 1 to 4"):
        build_encoding("irpe_nd", axes=axes)


def test_positions_with_another_axis_count_are_a_usage_error():
    with pytest.raises(UsageError, match="do not have 3 axes"):
        RelativeND(axes=3).map_ids(grid_positions(2, 2), grid_positions(2, 2))


# --- text: one axis in the text model ----------------------------------------------------------


@pytest.mark.parametrize("mode,on", [("bias", "qk"), ("contextual", "qkv")])
def test_a_text_model_takes_it_and_stays_causal(mode, on):
    """irpe_nd with one axis in the causal LM: a later token never changes an earlier logit."""
    from posenc_cli.models.text import TextModel

    torch.manual_seed(0)
    model = TextModel(kind="lm", vocab_size=11, dim=16, depth=1, heads=2, encoding="irpe_nd",
                      encoding_params={"axes": 1, "mode": mode, "on": on}).double()  # fmt: skip
    for m in model.modules():  # iRPE's zero tables would hide a term reading the future
        if isinstance(m, RelativeND):
            for p in m.parameters():
                torch.nn.init.normal_(p, std=0.5)
    tokens = torch.randint(0, 11, (2, 12))
    changed = tokens.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % 11
    before, after = model(tokens).logits, model(changed).logits
    assert torch.allclose(before[:, :8], after[:, :8]) and not torch.allclose(before, after)


def test_a_long_causal_sequence_takes_the_blocked_path_exactly():
    """Past 512 keys the content-free bias is asked one block of queries at a time (it is not
    a 1D distance table: negative distances would read as prefix tokens)."""
    enc = build(axes=1, mode="bias", on="qk")
    assert enc.content_free and not enc.toeplitz
    att = Attention(DIM, HEADS, enc, causal=True).double()
    n = 600
    pos, x = torch.arange(n), rand(1, n, DIM)
    s = HEAD_DIM**-0.5
    q = att.split_heads(att.q(x))
    k, v = (att.split_heads(t) for t in att.kv(x).chunk(2, -1))
    logits = torch.einsum("bhid,bhjd->bhij", q, k) * s + enc.bias(q, k, pos, pos)
    logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.einsum("bhij,bhjd->bhid", logits.softmax(-1), v)
    want = att.proj(out.transpose(1, 2).reshape(1, n, DIM))
    assert_close(att(x, positions=pos), want, **TIGHT)

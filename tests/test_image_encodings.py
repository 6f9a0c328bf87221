"""Image-grid encodings (sincos2d, learned2d, rope2d, swin) against independent references:
DETR's formula and Swin's index rebuilt with scalar math, dense float64 attention, invariance to a
2D shift of every position, and gradients through the real attention module."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.testing import assert_close

from posenc_cli.encodings.base import PositionEncoding, grid_positions
from posenc_cli.encodings.learned2d import Learned2D
from posenc_cli.encodings.rope2d import Rope2D
from posenc_cli.encodings.sincos2d import SinCos2D, sincos2d_table
from posenc_cli.encodings.swin import SwinBias, swin_index
from posenc_cli.errors import UsageError
from posenc_cli.models.attention import Attention

TIGHT = {"atol": 1e-9, "rtol": 1e-9}
DIM, HEADS, HEAD_DIM = 32, 4, 8


def rand(*shape: int, seed: int = 0) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def shifted(positions: Tensor, dr: int, dc: int) -> Tensor:
    """Move every grid token by (dr, dc); prefix tokens stay at (-1, -1)."""
    on_grid = positions[:, :1] >= 0
    return torch.where(on_grid, positions + torch.tensor([dr, dc]), positions)


BUILDERS = {
    "sincos2d-input": lambda: SinCos2D(dim=DIM, heads=HEADS, head_dim=HEAD_DIM),
    "sincos2d-qk": lambda: SinCos2D(dim=DIM, where="qk", heads=HEADS, head_dim=HEAD_DIM),
    "learned2d": lambda: Learned2D(dim=DIM, height=4, width=4, heads=HEADS, head_dim=HEAD_DIM),
    "rope2d-axial": lambda: Rope2D(heads=HEADS, head_dim=HEAD_DIM),
    "rope2d-mixed": lambda: Rope2D(variant="mixed", heads=HEADS, head_dim=HEAD_DIM),
    "swin": lambda: SwinBias(height=4, width=6, heads=HEADS, head_dim=HEAD_DIM),
}


def build(name: str, seed: int = 0) -> PositionEncoding:
    torch.manual_seed(seed)
    return BUILDERS[name]().double()


def attention(enc: PositionEncoding, seed: int = 0) -> Attention:
    torch.manual_seed(seed)
    return Attention(DIM, HEADS, enc).double()


# --- every class through the real attention module ---------------------------------------------


@pytest.mark.parametrize("name", list(BUILDERS))
def test_forward_on_rectangular_grid_is_finite_and_trains_every_parameter(name):
    enc = build(name)
    att = attention(enc)
    pos = grid_positions(3, 5, prefix=1)  # (16, 2)
    x = rand(2, 16, DIM)
    out = att(enc.embed(x, pos), positions=pos)
    assert out.shape == (2, 16, DIM) and torch.isfinite(out).all()
    out.square().sum().backward()
    for pname, p in enc.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"{name}.{pname} got no gradient"
    assert enc.dims == 2


@pytest.mark.parametrize("name", list(BUILDERS))
def test_attention_equals_dense_reference_from_the_hooks(name):
    """softmax(W_q(x+p) . W_k(x+p) * scale + bias) W_v x, rotated where the encoding rotates,
    written with plain tensor algebra in float64."""
    enc = build(name)
    att = attention(enc)
    pos = grid_positions(3, 5, prefix=1)
    x = enc.embed(rand(2, 16, DIM), pos)
    added = enc.qk_input(pos)
    qk_in = x if added is None else x + added
    Wq, Wkv = att.q.weight, att.kv.weight
    bq, bk, bv = att.q.bias, att.kv.bias[:DIM], att.kv.bias[DIM:]
    q = att.split_heads(qk_in @ Wq.T + bq)
    k = att.split_heads(qk_in @ Wkv[:DIM].T + bk)
    v = att.split_heads(x @ Wkv[DIM:].T + bv)  # values never see the position
    q, k = enc.rotate(q, k, pos, pos)
    logits = q @ k.transpose(-2, -1) * HEAD_DIM**-0.5
    bias = enc.bias(q, k, pos, pos)
    if bias is not None:
        logits = logits + bias
    out = logits.softmax(-1) @ v
    expected = att.proj(out.transpose(1, 2).reshape(2, 16, DIM))
    assert_close(att(x, positions=pos), expected, **TIGHT)
    # the position matters at all (a test that cannot fail is a defect)
    plain = attention(PositionEncoding(heads=HEADS, head_dim=HEAD_DIM).double())
    assert not torch.allclose(plain(rand(2, 16, DIM)), att(x, positions=pos), atol=1e-6)


@pytest.mark.parametrize("name", list(BUILDERS))
def test_sequence_positions_are_refused(name):
    enc = build(name)
    att = attention(enc)
    x = rand(1, 6, DIM)
    with pytest.raises(UsageError, match="grid positions"):
        att(enc.embed(x, torch.arange(6)), positions=torch.arange(6))


# --- sincos2d: DETR's PositionEmbeddingSine -----------------------------------------------------


def detr_reference(height: int, width: int, dim: int, temperature: float, normalize: bool):
    """DETR's PositionEmbeddingSine for an unpadded mask, one scalar at a time:
    cumulative sums of the not-mask, optional normalisation, dim_t, stack/flatten, cat(y, x)."""
    feats = dim // 2
    not_mask = [[1] * width for _ in range(height)]
    y_embed = [
        [sum(not_mask[i][c] for i in range(r + 1)) for c in range(width)] for r in range(height)
    ]
    x_embed = [
        [sum(not_mask[r][j] for j in range(c + 1)) for c in range(width)] for r in range(height)
    ]
    if normalize:
        eps, scale = 1e-6, 2 * math.pi
        y_embed = [
            [y_embed[r][c] / (y_embed[-1][c] + eps) * scale for c in range(width)]
            for r in range(height)
        ]
        x_embed = [
            [x_embed[r][c] / (x_embed[r][-1] + eps) * scale for c in range(width)]
            for r in range(height)
        ]
    dim_t = [temperature ** (2 * (j // 2) / feats) for j in range(feats)]

    def channels(t: float) -> list[float]:
        pos = [t / dim_t[j] for j in range(feats)]
        sines = [math.sin(pos[j]) for j in range(0, feats, 2)]
        cosines = [math.cos(pos[j]) for j in range(1, feats, 2)]
        return [v for pair in zip(sines, cosines, strict=True) for v in pair]  # stack + flatten

    rows = []
    for r in range(height):
        for c in range(width):
            rows.append(channels(y_embed[r][c]) + channels(x_embed[r][c]))  # cat(pos_y, pos_x)
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize(
    ("height", "width", "dim", "temperature"), [(3, 5, 16, 10000.0), (4, 2, 8, 20.0)]
)
def test_sincos2d_matches_detr_formula(height, width, dim, temperature, normalize):
    got = sincos2d_table(height, width, dim, temperature, normalize)
    assert got.shape == (height * width, dim)
    assert_close(
        got, detr_reference(height, width, dim, temperature, normalize), atol=1e-12, rtol=0
    )


def test_sincos2d_hand_checked_values():
    # dim 4: one pair per axis at frequency 1; rows/cols count from 1 (DETR's cumsum)
    t = sincos2d_table(2, 3, 4, normalize=False)
    r, c = 1, 2
    want = [math.sin(r + 1), math.cos(r + 1), math.sin(c + 1), math.cos(c + 1)]
    assert_close(t[r * 3 + c], torch.tensor(want, dtype=torch.float64), atol=1e-15, rtol=0)
    # normalised: the last row and column sit just below 2 pi
    t = sincos2d_table(2, 3, 4, normalize=True)
    last = t[-1]
    assert abs(last[0].item()) < 1e-5 and abs(last[1].item() - 1) < 1e-9
    assert abs(last[2].item()) < 1e-5


def test_sincos2d_input_embeds_once_with_zero_prefix():
    enc = build("sincos2d-input")
    pos = grid_positions(3, 5, prefix=2)
    x = rand(1, 17, DIM)
    out = enc.embed(x, pos)
    assert_close(out[:, :2], x[:, :2], atol=0, rtol=0)
    assert_close(out[:, 2:] - x[:, 2:], sincos2d_table(3, 5, DIM)[None], **TIGHT)
    assert enc.qk_input(pos) is None


def test_sincos2d_qk_leaves_the_input_alone_and_returns_the_table():
    enc = build("sincos2d-qk")
    pos = grid_positions(3, 5, prefix=1)
    x = rand(1, 16, DIM)
    assert enc.embed(x, pos) is x
    table = enc.qk_input(pos)
    assert table.shape == (16, DIM)
    assert (table[0] == 0).all()
    assert_close(table[1:], sincos2d_table(3, 5, DIM), **TIGHT)


def test_sincos2d_qk_through_attention_equals_detr_encoder_attention():
    """DETR's encoder: q = W_q (x + p), k = W_k (x + p), v = W_v x, in float64."""
    enc = build("sincos2d-qk")
    att = attention(enc, seed=3)
    pos = grid_positions(3, 5, prefix=1)
    x = rand(2, 16, DIM, seed=4)
    p = torch.cat([torch.zeros(1, DIM, dtype=torch.float64), sincos2d_table(3, 5, DIM)])
    Wq, Wk, Wv = att.q.weight, att.kv.weight[:DIM], att.kv.weight[DIM:]
    bq, bk, bv = att.q.bias, att.kv.bias[:DIM], att.kv.bias[DIM:]
    q = ((x + p) @ Wq.T + bq).view(2, 16, HEADS, HEAD_DIM).transpose(1, 2)
    k = ((x + p) @ Wk.T + bk).view(2, 16, HEADS, HEAD_DIM).transpose(1, 2)
    v = (x @ Wv.T + bv).view(2, 16, HEADS, HEAD_DIM).transpose(1, 2)
    weights = (q @ k.transpose(-2, -1) / math.sqrt(HEAD_DIM)).softmax(-1)
    expected = att.proj((weights @ v).transpose(1, 2).reshape(2, 16, DIM))
    assert_close(att(x, positions=pos), expected, **TIGHT)
    # adding p to the values too would be a different module
    v_wrong = ((x + p) @ Wv.T + bv).view(2, 16, HEADS, HEAD_DIM).transpose(1, 2)
    wrong = att.proj((weights @ v_wrong).transpose(1, 2).reshape(2, 16, DIM))
    assert not torch.allclose(att(x, positions=pos), wrong, atol=1e-6)


def test_sincos2d_rejects_bad_params():
    with pytest.raises(UsageError, match="dim must be a multiple of 4"):
        SinCos2D(dim=30)
    with pytest.raises(UsageError, match="where"):
        SinCos2D(dim=32, where="values")  # type: ignore[arg-type]


# --- learned2d: DeiT's table with bicubic resizing ----------------------------------------------


def grid_part_interpolated(table: Tensor, old: tuple[int, int], new: tuple[int, int], aa: bool):
    """The patch rows of ``table`` (after one prefix row) resized by F.interpolate directly."""
    grid = table[1:].reshape(1, old[0], old[1], -1).permute(0, 3, 1, 2).float()
    out = F.interpolate(grid, size=new, mode="bicubic", align_corners=False, antialias=aa)
    return out.permute(0, 2, 3, 1).reshape(new[0] * new[1], -1).double()


def test_learned2d_same_grid_is_the_table_itself():
    enc = build("learned2d")
    pos = grid_positions(4, 4, prefix=1)
    x = rand(2, 17, DIM)
    assert_close(enc.embed(x, pos), x + enc.table, atol=0, rtol=0)
    assert enc.table.shape == (1 + 16, DIM)


@pytest.mark.parametrize("antialias", [False, True])
@pytest.mark.parametrize("new", [(3, 5), (6, 7)])
def test_learned2d_resize_is_bicubic_on_the_grid_and_keeps_prefix(new, antialias):
    torch.manual_seed(0)
    enc = Learned2D(dim=DIM, height=4, width=4, antialias=antialias).double()
    got = enc.resized(*new)
    assert got.shape == (1 + new[0] * new[1], DIM)
    assert_close(got[:1], enc.table[:1], atol=0, rtol=0)  # prefix rows untouched
    want = grid_part_interpolated(enc.table.detach(), (4, 4), new, antialias)
    assert_close(got[1:].detach(), want, atol=1e-6, rtol=1e-5)  # timm resizes in float32
    other = grid_part_interpolated(enc.table.detach(), (4, 4), new, not antialias)
    assert not torch.allclose(got[1:].detach(), other, atol=1e-3)  # the flag matters


def test_learned2d_embed_on_other_grid_reads_resized_rows_by_position():
    enc = build("learned2d")
    pos = grid_positions(3, 5, prefix=1)
    x = rand(1, 16, DIM)
    out = enc.embed(x, pos)
    assert_close(out, x + enc.resized(3, 5), **TIGHT)
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(1))
    assert_close(enc.embed(x[:, perm], pos[perm]), out[:, perm], **TIGHT)
    out.sum().backward()
    assert enc.table.grad is not None and enc.table.grad[1:].abs().sum() > 0


def test_learned2d_class_and_distillation_tokens_read_their_own_rows():
    torch.manual_seed(0)
    enc = Learned2D(dim=DIM, height=2, width=3, prefix_tokens=2).double()  # DeiT with distillation
    pos = grid_positions(2, 3, prefix=2)
    x = torch.zeros(1, 8, DIM, dtype=torch.float64)
    assert_close(enc.embed(x, pos)[0], enc.table, atol=0, rtol=0)
    resized = enc.embed(torch.zeros(1, 14, DIM, dtype=torch.float64), grid_positions(3, 4, 2))
    assert_close(resized[0, :2], enc.table[:2], atol=0, rtol=0)


def test_learned2d_prefix_count_must_match():
    enc = build("learned2d")
    with pytest.raises(UsageError, match="prefix_tokens=2"):
        enc.embed(rand(1, 18, DIM), grid_positions(4, 4, prefix=2))


def test_learned2d_init_is_deit_trunc_normal():
    torch.manual_seed(0)
    enc = Learned2D(dim=192, height=14, width=14)
    assert enc.table.shape == (197, 192)
    assert 0.019 < enc.table.std().item() < 0.021 and abs(enc.table.mean().item()) < 1e-3


# --- rope2d: RoPE-ViT axial and mixed ------------------------------------------------------------


def reference_angle(enc: Rope2D, head: int, row: int, col: int, pair: int) -> float:
    """RoPE-ViT's angle of one pair, from the paper's formulas with scalar math."""
    d = enc.head_dim
    if row < 0:  # prefix token: not rotated
        return 0.0
    if enc.variant == "axial":
        i = pair % (d // 4)
        freq = enc.base ** (-4 * i / d)
        return (col if pair < d // 4 else row) * freq
    return row * enc.row_freqs[head, pair].item() + col * enc.col_freqs[head, pair].item()


def rotate_reference(enc: Rope2D, x: Tensor, positions: Tensor) -> Tensor:
    """Turn each interleaved pair (x_2j, x_2j+1) of ``x`` ``(B, H, N, d)`` by its angle."""
    out = x.clone()
    B, H, N, d = x.shape
    for h in range(H):
        for n in range(N):
            row, col = positions[n].tolist()
            for j in range(d // 2):
                a = reference_angle(enc, h, row, col, j)
                c, s = math.cos(a), math.sin(a)
                x0, x1 = x[:, h, n, 2 * j], x[:, h, n, 2 * j + 1]
                out[:, h, n, 2 * j] = x0 * c - x1 * s
                out[:, h, n, 2 * j + 1] = x0 * s + x1 * c
    return out


@pytest.mark.parametrize("variant", ["axial", "mixed"])
def test_rope2d_rotation_matches_scalar_reference(variant):
    enc = build(f"rope2d-{variant}")
    pos = grid_positions(2, 3, prefix=1)
    q, k = rand(2, HEADS, 7, HEAD_DIM, seed=1), rand(2, HEADS, 7, HEAD_DIM, seed=2)
    q_rot, k_rot = enc.rotate(q, k, pos, pos)
    assert_close(q_rot, rotate_reference(enc, q, pos), **TIGHT)
    assert_close(k_rot, rotate_reference(enc, k, pos), **TIGHT)


@pytest.mark.parametrize("variant", ["axial", "mixed"])
def test_rope2d_scores_depend_only_on_the_2d_offset(variant):
    enc = build(f"rope2d-{variant}")
    pos = grid_positions(3, 4)
    q, k = rand(1, HEADS, 12, HEAD_DIM, seed=1), rand(1, HEADS, 12, HEAD_DIM, seed=2)

    def scores(p: Tensor) -> Tensor:
        qr, kr = enc.rotate(q, k, p, p)
        return qr @ kr.transpose(-2, -1)

    base = scores(pos)
    for dr, dc in [(0, 3), (5, 0), (2, 7)]:
        assert_close(scores(shifted(pos, dr, dc)), base, **TIGHT)
    # but the positions are seen: transposing the grid changes the scores
    assert not torch.allclose(scores(pos.flip(-1)), base, atol=1e-6)
    assert not torch.allclose(base, q @ k.transpose(-2, -1), atol=1e-6)


@pytest.mark.parametrize("variant", ["axial", "mixed"])
def test_rope2d_prefix_tokens_are_not_rotated(variant):
    enc = build(f"rope2d-{variant}")
    pos = grid_positions(2, 2, prefix=2)
    q, k = rand(1, HEADS, 6, HEAD_DIM, seed=1), rand(1, HEADS, 6, HEAD_DIM, seed=2)
    q_rot, k_rot = enc.rotate(q, k, pos, pos)
    assert_close(q_rot[:, :, :2], q[:, :, :2], atol=0, rtol=0)
    assert_close(k_rot[:, :, :2], k[:, :, :2], atol=0, rtol=0)
    assert not torch.allclose(q_rot[:, :, 3:], q[:, :, 3:])


def test_rope2d_queries_shorter_than_keys_use_the_key_tail():
    enc = build("rope2d-mixed")
    pos = grid_positions(3, 3, prefix=1)
    q, k = rand(1, HEADS, 4, HEAD_DIM, seed=1), rand(1, HEADS, 10, HEAD_DIM, seed=2)
    q_rot, _ = enc.rotate(q, k, pos[6:], pos)
    assert_close(q_rot, rotate_reference(enc, q, pos[6:]), **TIGHT)
    q_rot2, _ = enc.rotate(q, k, pos[6:].clone(), pos)  # not a view: recomputed
    assert_close(q_rot2, q_rot, **TIGHT)


def test_rope2d_defaults_and_mixed_init_follow_the_paper():
    assert Rope2D(head_dim=16).base == 100.0
    assert Rope2D(variant="mixed", head_dim=16).base == 10.0
    assert Rope2D(variant="mixed", base=50.0, head_dim=16).base == 50.0
    torch.manual_seed(0)
    enc = Rope2D(variant="mixed", heads=3, head_dim=16).double()
    q4 = 16 // 4
    for h in range(3):
        col, row = enc.col_freqs[h].tolist(), enc.row_freqs[h].tolist()
        for i in range(q4):
            mag = 10.0 ** (-4 * i / 16)
            assert math.hypot(col[i], row[i]) == pytest.approx(mag, rel=1e-6)
            assert math.hypot(col[q4 + i], row[q4 + i]) == pytest.approx(mag, rel=1e-6)
            # the second quarter is the first turned by +90 degrees: (c, r) -> (-r, c)
            assert col[q4 + i] == pytest.approx(-row[i], abs=1e-6)
            assert row[q4 + i] == pytest.approx(col[i], abs=1e-6)
            # one random direction per head, shared by every magnitude
            assert math.atan2(row[i], col[i]) == pytest.approx(math.atan2(row[0], col[0]))
    directions = {
        round(math.atan2(enc.row_freqs[h, 0].item(), enc.col_freqs[h, 0].item()), 6)
        for h in range(3)
    }
    assert len(directions) == 3
    assert Rope2D.per_layer and Rope2D.family == "rotary"
    assert not list(Rope2D(head_dim=16).parameters())


def test_rope2d_mixed_frequencies_receive_gradients_through_attention():
    enc = build("rope2d-mixed")
    att = attention(enc)
    pos = grid_positions(3, 5, prefix=1)
    att(rand(2, 16, DIM), positions=pos).square().sum().backward()
    for p in (enc.row_freqs, enc.col_freqs):
        assert p.grad is not None and p.grad.shape == (HEADS, HEAD_DIM // 2)
        assert (p.grad.abs().sum(-1) > 0).all()  # every head


def test_rope2d_rejects_bad_params():
    with pytest.raises(UsageError, match="head_dim must be a multiple of 4"):
        Rope2D(head_dim=6)
    with pytest.raises(UsageError, match="base"):
        Rope2D(base=1.0)


# --- swin: learned 2D relative bias --------------------------------------------------------------


def swin_index_reference(positions: list[list[int]], height: int, width: int) -> list[list[int]]:
    """Swin's relative_position_index, one pair at a time; prefix pairs -> (2H-1)(2W-1)."""
    out = []
    for ri, ci in positions:
        row = []
        for rj, cj in positions:
            if ri < 0 or rj < 0:
                row.append((2 * height - 1) * (2 * width - 1))
                continue
            dr, dc = ri - rj, ci - cj  # query minus key
            row.append((dr + height - 1) * (2 * width - 1) + (dc + width - 1))
        out.append(row)
    return out


@pytest.mark.parametrize(("h", "w", "height", "width"), [(3, 5, 3, 5), (2, 3, 4, 6), (4, 4, 4, 4)])
def test_swin_index_matches_scalar_loop(h, w, height, width):
    pos = grid_positions(h, w, prefix=1)
    got = swin_index(pos, pos, height, width)
    assert got.tolist() == swin_index_reference(pos.tolist(), height, width)
    if (h, w) == (height, width):  # the full window reaches every offset entry exactly once
        assert set(got[1:, 1:].flatten().tolist()) == set(range((2 * h - 1) * (2 * w - 1)))


def test_swin_bias_reads_the_table_and_depends_only_on_the_offset():
    enc = build("swin")  # table for 4 x 6
    pos = grid_positions(3, 5, prefix=1)
    bias = enc.bias(None, None, pos, pos)
    assert bias.shape == (1, HEADS, 16, 16)
    index = swin_index_reference(pos.tolist(), 4, 6)
    for i in range(16):
        for j in range(16):
            want = enc.prefix_bias if index[i][j] == 7 * 11 else enc.table[index[i][j]]
            assert_close(bias[0, :, i, j], want, atol=0, rtol=0)
    # shifting the grid inside the table's range leaves the bias unchanged
    assert_close(enc.bias(None, None, shifted(pos, 1, 1), shifted(pos, 1, 1)), bias, atol=0, rtol=0)
    # equal offsets read equal biases: (0,0)->(1,2) and (1,1)->(2,3)
    at = {tuple(p): n for n, p in enumerate(pos.tolist())}
    assert_close(bias[0, :, at[(0, 0)], at[(1, 2)]], bias[0, :, at[(1, 1)], at[(2, 3)]])
    assert not torch.allclose(
        bias[0, :, at[(0, 0)], at[(1, 2)]], bias[0, :, at[(1, 2)], at[(0, 0)]]
    )


def test_swin_prefix_pairs_share_one_bias_per_head():
    enc = build("swin")
    pos = grid_positions(2, 3, prefix=2)
    bias = enc.bias(None, None, pos, pos)[0]  # (H, 8, 8)
    want = enc.prefix_bias[:, None, None]  # (H, 1, 1)
    assert_close(bias[:, :2, :], want.expand(HEADS, 2, 8), atol=0, rtol=0)
    assert_close(bias[:, :, :2], want.expand(HEADS, 8, 2), atol=0, rtol=0)
    assert not torch.allclose(bias[:, 2:, 2:], want.expand(HEADS, 6, 6))


def test_swin_grid_larger_than_table_is_a_usage_error():
    enc = build("swin")  # 4 x 6
    for h, w in [(5, 3), (2, 7)]:
        pos = grid_positions(h, w, prefix=1)
        with pytest.raises(UsageError, match=r"height=4, width=6.*height >= \d+, width >= \d+"):
            enc.bias(None, None, pos, pos)
    with pytest.raises(UsageError, match="height and width"):
        SwinBias(height=0)


def test_swin_init_and_class_attributes():
    torch.manual_seed(0)
    enc = SwinBias(height=7, width=7, heads=3)
    assert enc.table.shape == (13 * 13, 3) and enc.prefix_bias.shape == (3,)
    assert 0.015 < enc.table.std().item() < 0.025
    assert SwinBias.per_layer and SwinBias.family == "bias" and SwinBias.dims == 2
    assert isinstance(enc.table, nn.Parameter)

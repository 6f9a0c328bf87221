"""Local window attention against full attention masked to the window (float64, 1e-9)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from posenc_cli.encodings import ENCODINGS, build_encoding
from posenc_cli.encodings.base import grid_positions
from posenc_cli.errors import UsageError
from posenc_cli.models.attention import Attention
from posenc_cli.models.window import slot_keys, slot_offsets

IMAGE = ["none"] + [n for n in ENCODINGS if ENCODINGS[n].dims == 2]
DIM, HEADS = 16, 2


def pair(
    name: str, window: int, dilation: int = 1, options: dict | None = None, **params
) -> tuple[Attention, Attention]:
    """Window and full attention sharing one encoding and the same weights; ``options`` are
    more of the window's (stride, global_tokens)."""
    torch.manual_seed(0)
    enc = build_encoding(name, dim=DIM, heads=HEADS, head_dim=DIM // HEADS, **params).double()
    for p in enc.parameters():  # make every table matter
        torch.nn.init.normal_(p, std=0.5)
    windowed = Attention(
        DIM, HEADS, enc, window=window, dilation=dilation, **(options or {})
    ).double()
    full = Attention(DIM, HEADS, enc).double()
    full.load_state_dict(windowed.state_dict())
    return windowed, full


def window_mask(positions: torch.Tensor, window: int, dilation: int = 1) -> torch.Tensor:
    """Who may attend whom: prefix tokens everything, patches their window and the prefix."""
    r = window // 2
    offset = positions[:, None, :] - positions[None, :, :]  # (N, N, 2)
    near = (offset.abs() <= r * dilation).all(-1) & (offset % dilation == 0).all(-1)
    prefix = positions[:, 0] < 0
    return near | prefix[:, None] | prefix[None, :]


def masked_full_attention(att: Attention, x: torch.Tensor, positions, mask) -> torch.Tensor:
    """The full path's arithmetic written out from the hooks, with an extra mask."""
    enc = att.encoding
    x = enc.embed(x, positions)
    q, kv = att.q(x), att.kv(x)
    added = enc.qk_input(positions)
    if added is not None:
        q = q + F.linear(added.to(x.dtype), att.q.weight)
        kv = kv + F.pad(F.linear(added.to(x.dtype), att.kv.weight[:DIM]), (0, DIM))
    q = att.split_heads(q)
    k, v = (att.split_heads(t) for t in kv.chunk(2, -1))
    q, k = enc.rotate(q, k, positions, positions)
    logits = q @ k.transpose(-2, -1) * enc.logit_scale()
    bias = enc.bias(q, k, positions, positions)
    logits = logits if bias is None else logits + bias
    weights = logits.masked_fill(~mask, float("-inf")).softmax(-1)
    out = weights @ v
    extra = enc.value(weights, positions, positions)
    out = out if extra is None else out + extra
    return att.proj(out.transpose(1, 2).reshape(x.shape))


@pytest.mark.parametrize("name", IMAGE)
@pytest.mark.parametrize(("height", "width", "prefix", "window"), [(5, 6, 1, 3), (4, 7, 0, 5)])
def test_window_equals_full_attention_masked_to_the_window(name, height, width, prefix, window):
    params = {"swin": {"height": 7, "width": 7}, "learned2d": {"prefix_tokens": prefix}}
    windowed, full = pair(name, window, **params.get(name, {}))
    positions = grid_positions(height, width, prefix)
    x = torch.randn(2, len(positions), DIM, dtype=torch.float64)
    x_in = windowed.encoding.embed(x, positions)
    got = windowed(x_in, positions=positions)
    want = masked_full_attention(full, x, positions, window_mask(positions, window))
    torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("name", IMAGE)
@pytest.mark.parametrize(("height", "width", "prefix", "window", "dilation"),
                         [(7, 8, 1, 3, 2), (9, 7, 0, 3, 3)])  # fmt: skip
def test_dilated_window_equals_full_attention_masked_to_its_slots(
    name, height, width, prefix, window, dilation
):
    params = {"swin": {"height": 9, "width": 9}, "learned2d": {"prefix_tokens": prefix}}
    windowed, full = pair(name, window, dilation, **params.get(name, {}))
    positions = grid_positions(height, width, prefix)
    x = torch.randn(2, len(positions), DIM, dtype=torch.float64)
    got = windowed(windowed.encoding.embed(x, positions), positions=positions)
    want = masked_full_attention(full, x, positions, window_mask(positions, window, dilation))
    torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-9)


def test_dilation_needs_a_window():
    with pytest.raises(UsageError, match="dilation must be an integer >= 1 and needs a window"):
        Attention(DIM, HEADS, dilation=2)


@pytest.mark.parametrize("name", IMAGE)
def test_a_window_covering_the_grid_is_full_attention(name):
    windowed, full = pair(name, 9, **({"height": 9, "width": 9} if name == "swin" else {}))
    positions = grid_positions(3, 4, 1)
    x = torch.randn(1, 13, DIM, dtype=torch.float64)
    torch.testing.assert_close(
        windowed(x, positions=positions), full(x, positions=positions), atol=1e-9, rtol=1e-9
    )


def test_slots_and_their_keys():
    offsets = slot_offsets(3)
    assert offsets.tolist()[0] == [1, 1] and offsets.tolist()[4] == [0, 0]  # query minus key
    keys = slot_keys(3, 4, offsets)  # a 3 x 4 grid, 12 = off the grid
    assert keys[5].tolist() == [0, 1, 2, 4, 5, 6, 8, 9, 10]  # around (1, 1)
    assert keys[0].tolist() == [12, 12, 12, 12, 0, 1, 12, 4, 5]  # the corner (0, 0)
    assert (keys[0] < 12).tolist() == [0, 0, 0, 0, 1, 1, 0, 1, 1]  # on the grid


def test_window_needs_an_odd_size_and_no_memory():
    with pytest.raises(UsageError, match="odd number"):
        Attention(DIM, HEADS, window=4)
    with pytest.raises(UsageError, match="takes no memory"):
        Attention(DIM, HEADS, window=3)(torch.randn(1, 5, DIM), memory=torch.randn(1, 2, DIM))


def test_swin_table_must_cover_the_window():
    windowed, _ = pair("swin", 7, height=3, width=3)
    with pytest.raises(UsageError, match="window reaching 3 patches"):
        windowed(torch.randn(1, 16, DIM).double(), positions=grid_positions(4, 4))

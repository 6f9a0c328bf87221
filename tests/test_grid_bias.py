"""A grid bias read by the flash kernel as views, one column of queries at a time
(kernels/grid_bias.py), against the encoding's dense bias in float64: values, gradients through
the blocked backward, prefix tokens, grids that are not square."""

from __future__ import annotations

import pytest
import torch

from posenc_cli.encodings import encoding_class
from posenc_cli.encodings.base import BackboneFacts, grid_positions
from posenc_cli.kernels import blocked_bias
from posenc_cli.kernels.grid_bias import GridTable
from posenc_cli.kernels.positions import row_major_grid
from posenc_cli.models.attention import Attention
from tests.test_blocked_bias import same_results

SETTINGS = [
    ("swin", {}),
    ("irpe", {"mode": "bias", "on": "qk", "method": "product"}),
    ("irpe", {"mode": "bias", "on": "k", "method": "cross"}),
    ("irpe", {"mode": "bias", "on": "k", "method": "euclidean", "shared_head": False}),
    ("irpe", {"mode": "bias", "on": "k", "method": "quant"}),
]


def encoding(name, params, rows, cols, prefix):
    facts = BackboneFacts(dim=32, heads=4, height=rows, width=cols, prefix_tokens=prefix)
    enc = encoding_class(name)(**facts.for_encoding(encoding_class(name), params)).double()
    for p in enc.parameters():  # tables away from their small initial values
        torch.nn.init.normal_(p)
    return enc


def dense(q, k, v, bias, scale):
    return ((q @ k.transpose(-2, -1)) * scale + bias).softmax(-1) @ v


@pytest.mark.parametrize("name, params", SETTINGS)
@pytest.mark.parametrize("rows, cols, prefix", [(5, 7, 0), (6, 4, 1), (3, 3, 2), (7, 1, 2)])
def test_column_views_give_the_dense_attention(name, params, rows, cols, prefix):
    torch.manual_seed(0)
    enc = encoding(name, params, rows, cols, prefix)
    pos = grid_positions(rows, cols, prefix)
    q, k, v = (torch.randn(2, 4, len(pos), 8, dtype=torch.float64) for _ in range(3))
    table = GridTable(enc.bias, q, pos, row_major_grid(pos))
    out, lse = table.attend(q, k, v, 0.3)
    bias = enc.bias(q, k, pos, pos)
    torch.testing.assert_close(out, dense(q, k, v, bias, 0.3), rtol=0, atol=1e-12)
    want_lse = ((q @ k.transpose(-2, -1)) * 0.3 + bias).logsumexp(-1)
    torch.testing.assert_close(lse, want_lse, rtol=0, atol=1e-12)


def test_the_offset_table_is_the_bias_of_every_offset():
    enc = encoding("swin", {}, 4, 5, 1)
    pos = grid_positions(4, 5, 1)
    q = torch.zeros(1, 4, 1, 8, dtype=torch.float64)
    table = GridTable(enc.bias, q, pos, (4, 5, 1)).offsets()  # (H, 7, 9)
    bias = enc.bias(q, q, pos, pos)[0]
    for i in range(1, len(pos)):
        for j in range(1, len(pos)):
            dy, dx = (pos[j] - pos[i]).tolist()
            torch.testing.assert_close(table[:, 3 + dy, 4 + dx], bias[:, i, j], rtol=0, atol=0)


def test_the_column_views_lie_in_the_column_tables():
    enc = encoding("swin", {}, 4, 5, 0)
    pos = grid_positions(4, 5)
    q = torch.zeros(1, 4, 1, 8, dtype=torch.float64)
    table = GridTable(enc.bias, q, pos, (4, 5, 0))
    views = table.column_views(torch.float64)
    assert views.shape == (5, 4, 4, 20)
    assert views.untyped_storage().nbytes() == 5 * 4 * 7 * 5 * 8  # C tables of (2R - 1) x C


@pytest.mark.parametrize(
    "positions",
    [
        grid_positions(4, 5, 1)[torch.tensor([0, 2, 1, *range(3, 21)])],  # patches out of order
        grid_positions(4, 5, 1)[:-1],  # a grid missing a patch
        grid_positions(1, 5, 1),  # one row: nothing to view
        torch.arange(10),  # a sequence
        torch.cat([grid_positions(3, 3)[:2], grid_positions(0, 0, 1), grid_positions(3, 3)[2:]]),
    ],
)
def test_only_the_row_major_layout_is_taken(positions):
    assert row_major_grid(positions) is None


@pytest.mark.parametrize("name, params", SETTINGS[:2])
def test_the_module_takes_the_views_with_the_same_result_and_gradients(monkeypatch, name, params):
    torch.manual_seed(0)
    att = Attention(32, 4, encoding(name, params, 5, 6, 1)).double()
    pos = grid_positions(5, 6, prefix=1)
    x = torch.randn(2, 31, 32, dtype=torch.float64, requires_grad=True)
    inputs = [x, *att.parameters()]
    attended = []
    real = GridTable.attend
    monkeypatch.setattr(GridTable, "attend", lambda *a: attended.append(1) or real(*a))

    def run(blocked: bool):
        monkeypatch.setattr(blocked_bias, "MIN_PAIRS", 1 if blocked else 1 << 40)
        monkeypatch.setattr(blocked_bias, "BLOCK", 8)
        out = att(x, positions=pos)
        torch.manual_seed(2)
        return out, torch.autograd.grad(out, inputs, torch.randn_like(out))

    fast, fast_grads = run(True)
    assert attended
    slow, slow_grads = run(False)
    same_results(fast, fast_grads, slow, slow_grads)


def test_no_forward_call_asks_for_a_square_bias():
    """The views need the encoding's bias only for the corners, the prefix rows and columns."""
    enc = encoding("swin", {}, 8, 8, 1)
    asked = []

    def bias(q, k, q_pos, k_pos):
        asked.append((len(q_pos), len(k_pos)))
        return enc.bias(q, k, q_pos, k_pos)

    pos = grid_positions(8, 8, 1)
    q, k, v = (torch.randn(1, 4, 65, 8, dtype=torch.float64) for _ in range(3))
    GridTable(bias, q, pos, (8, 8, 1)).attend(q, k, v, 0.3)
    assert sorted(asked) == [(1, 65), (4, 64), (64, 1)]


def test_float32_views_keep_float32_precision():
    torch.manual_seed(0)
    enc = encoding("swin", {}, 6, 5, 1).float()
    pos = grid_positions(6, 5, 1)
    q, k, v = (torch.randn(3, 4, len(pos), 8) for _ in range(3))
    out, _ = GridTable(enc.bias, q, pos, row_major_grid(pos)).attend(q, k, v, 0.3)
    want = dense(q.double(), k.double(), v.double(), enc.bias(q, k, pos, pos).double(), 0.3)
    assert (out.double() - want).abs().max() < 1e-5


def test_a_frozen_grid_bias_takes_the_flash_backward(monkeypatch):
    torch.manual_seed(0)
    att = Attention(32, 4, encoding("swin", {}, 5, 6, 1)).double()
    att.encoding.requires_grad_(False)
    pos = grid_positions(5, 6, prefix=1)
    x = torch.randn(2, 31, 32, dtype=torch.float64, requires_grad=True)

    def run(blocked: bool):
        monkeypatch.setattr(blocked_bias, "MIN_PAIRS", 1 if blocked else 1 << 40)
        out = att(x, positions=pos)
        torch.manual_seed(2)
        return out, torch.autograd.grad(out, x, torch.randn_like(out))[0]

    (fast, fast_grad), (slow, slow_grad) = run(True), run(False)
    torch.testing.assert_close(fast, slow, rtol=0, atol=1e-12)
    torch.testing.assert_close(fast_grad, slow_grad, rtol=0, atol=1e-11)


def test_a_table_laid_out_for_other_positions_is_not_used():
    enc = encoding("swin", {}, 4, 4, 0)
    table = GridTable(enc.bias, torch.zeros(1, 4, 1, 8), grid_positions(4, 4), (4, 4, 0))
    assert table.serves(grid_positions(4, 4), grid_positions(4, 4), False)
    assert not table.serves(grid_positions(4, 4), grid_positions(4, 4), True)
    assert not table.serves(grid_positions(4, 4).flip(0), grid_positions(4, 4), False)

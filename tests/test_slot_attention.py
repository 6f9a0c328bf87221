"""The slot kernel (``kernels/slot_attention.py``): online softmax over shifted key views with a
hand-written backward, against a literal per-slot softmax in float64 (outputs, log-sum-exps and
every gradient), and the window path's gradients against full attention under the same mask."""

from __future__ import annotations

import pytest
import torch

from posenc_cli.encodings.base import grid_positions
from posenc_cli.kernels.slot_attention import slot_attention
from posenc_cli.models.window import slot_table, window_attention
from tests.test_sparse_windows import ENCODERS, dense, grid_encoding, literal_mask

CPU = torch.device("cpu")
TIGHT = {"atol": 1e-9, "rtol": 1e-9}


def literal(q, k, v, offsets, valid, scale, height, width, bias):
    """Each query's slot keys picked one by one (clamped where off the grid, then masked), a
    plain softmax over them."""
    rows = torch.arange(height).repeat_interleave(width)[:, None] - offsets[:, 0]
    cols = torch.arange(width).repeat(height)[:, None] - offsets[:, 1]
    index = rows.clamp(0, height - 1) * width + cols.clamp(0, width - 1)  # (N, K)
    logits = (q[:, :, :, None] * k[:, :, index]).sum(-1) * scale
    logits = logits if bias is None else logits + bias
    logits = logits.masked_fill(~valid, float("-inf"))
    weights = logits.softmax(-1).nan_to_num(0.0)  # a row with no valid slot weighs nothing
    return (weights[..., None] * v[:, :, index]).sum(-2), logits.logsumexp(-1)


def rand(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()


# (height, width, window, dilation, stride, global patches)
PATTERNS = [(5, 7, 3, 1, None, 0), (6, 5, 3, 2, None, 2), (7, 6, 3, 1, 3, 3), (4, 4, 3, 1, None, 6)]


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("bias_shape", [None, "full", "per_slot"])
def test_the_kernel_equals_a_literal_softmax_over_the_slots(pattern, bias_shape):
    height, width, window, dilation, stride, global_tokens = pattern
    offsets, _, valid = slot_table(height, width, window, dilation, stride, global_tokens, CPU)
    N, K = height * width, len(offsets)
    q, k, v = (rand(2, 3, N, 4, seed=s) for s in range(3))
    bias = {None: None, "full": rand(2, 3, N, K, seed=3), "per_slot": rand(1, 3, 1, K, seed=4)}
    b = bias[bias_shape]
    out, lse = slot_attention(q, k, v, offsets, valid, 0.5, height, width, b)
    want_out, want_lse = literal(q, k, v, offsets, valid, 0.5, height, width, b)
    torch.testing.assert_close(out, want_out, **TIGHT)
    torch.testing.assert_close(lse, want_lse, **TIGHT)  # -inf where no slot is valid
    inputs = [q, k, v] + ([b] if b is not None else [])
    g_out, g_lse = rand(*out.shape, seed=5), rand(*lse.shape, seed=6)
    finite = torch.isfinite(want_lse)

    def loss(o, s):
        return (o * g_out).sum() + (s.masked_fill(~finite, 0.0) * g_lse).sum()

    got = torch.autograd.grad(loss(out, lse), inputs)
    want = torch.autograd.grad(loss(want_out, want_lse), inputs)
    for a, w in zip(got, want, strict=True):
        torch.testing.assert_close(a, w, **TIGHT)


def test_a_query_with_no_valid_slot_is_zero():
    """On a 4 x 4 grid with 6 global patches, patch 0's 3 x 3 slots are all global or off the
    grid: its output is 0 and its log-sum-exp -inf, and nothing is NaN."""
    offsets, _, valid = slot_table(4, 4, 3, 1, None, 6, CPU)
    assert not valid[0].any()
    q, k, v = (rand(1, 1, 16, 4, seed=s) for s in range(3))
    out, lse = slot_attention(q, k, v, offsets, valid, 1.0, 4, 4)
    assert torch.equal(out[0, 0, 0], torch.zeros(4)) and lse[0, 0, 0] == float("-inf")
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.parametrize(("name", "params"), ENCODERS)
@pytest.mark.parametrize("global_tokens", [0, 3])
def test_window_gradients_equal_full_attention_under_the_same_mask(name, params, global_tokens):
    """Both paths of the window (the slot kernel without a value term, explicit weights with
    one), with a class token and global patches: gradients of q, k, v and the tables."""
    height, width, prefix = 5, 6, 1
    enc = grid_encoding(name, params, 2 * height, 2 * width, prefix)
    pos = grid_positions(height, width, prefix)
    q, k, v = (rand(2, 4, len(pos), 8, seed=s) for s in range(3))
    mask = literal_mask(height, width, prefix, 3, 1, 2, global_tokens)
    g = rand(2, 4, len(pos), 8, seed=7)
    inputs = [q, k, v, *enc.parameters()]
    got = torch.autograd.grad(
        (window_attention(q, k, v, enc, pos, 3, 0.3, 1, 2, global_tokens) * g).sum(), inputs
    )
    want = torch.autograd.grad((dense(q, k, v, enc, pos, mask, 0.3) * g).sum(), inputs)
    for a, w in zip(got, want, strict=True):
        torch.testing.assert_close(a, w, **TIGHT)

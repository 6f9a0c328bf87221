"""Local k x k window attention on an image grid: cost O(N k^2 d) instead of O(N^2 d).

The source article's suggestion for long image sequences: each patch attends only to the
``k x k`` patches around it (zero-padded at the border, the padding masked), plus every prefix
(class) token. Prefix tokens stay global: they attend to all tokens, which costs O(P N d).
A dilated window (``dilation`` d, as in dilated convolutions and the sparse patterns of the
source article's section 5) takes every d-th patch over a span of ``(k - 1) d + 1``: the same
``k*k`` slots and cost, a wider reach. Every patch query sees the same ``K = k*k`` slots at fixed
2D offsets, which is what lets a
relative encoding compute its term per slot once (``window_bias`` / ``window_value``).

Keys of each window are gathered into ``(B, H, N, K, d)``: memory linear in the number of
patches, traded for one batched contraction instead of a Python loop over slots.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc_cli.encodings.base import PositionEncoding, grid_shape


def slot_offsets(window: int, device=None, dilation: int = 1) -> Tensor:
    """(row, col) of the query minus that of the key for each slot, ``(K, 2)``, slots in the
    row-major order of the key's place in the window; a dilated window's slots are
    ``dilation`` patches apart."""
    r = window // 2
    steps = torch.arange(-r, r + 1, device=device) * dilation
    key_rows, key_cols = torch.meshgrid(steps, steps, indexing="ij")
    return -torch.stack([key_rows.flatten(), key_cols.flatten()], dim=-1)  # (K, 2)


def gather_windows(x: Tensor, height: int, width: int, window: int, dilation: int = 1) -> Tensor:
    """``(B, H, h*w, d)`` patches -> ``(B, H, h*w, K, d)``: each patch's window, zero-padded;
    with ``dilation`` the window spans ``(k - 1) * dilation + 1`` patches and takes every
    ``dilation``-th."""
    B, H, _, d = x.shape
    r = (window // 2) * dilation
    span = 2 * r + 1
    grid = x.reshape(B, H, height, width, d)
    padded = F.pad(grid, (0, 0, r, r, r, r))  # (B, H, h + 2r, w + 2r, d)
    windows = padded.unfold(2, span, 1).unfold(3, span, 1)  # (B, H, h, w, d, span, span)
    windows = windows[..., ::dilation, ::dilation]  # (B, H, h, w, d, k, k)
    return windows.permute(0, 1, 2, 3, 5, 6, 4).reshape(B, H, height * width, window**2, d)


def valid_slots(height: int, width: int, window: int, device=None, dilation: int = 1) -> Tensor:
    """True where a slot falls on the grid, ``(h*w, K)``."""
    ones = torch.ones(1, 1, height * width, 1, device=device)
    return gather_windows(ones, height, width, window, dilation)[0, 0, :, :, 0] > 0


def _plus(a: Tensor, b: Tensor | None) -> Tensor:
    return a if b is None else a + b


def window_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    encoding: PositionEncoding,
    positions: Tensor,
    window: int,
    scale: float,
    dilation: int = 1,
) -> Tensor:
    """Attention of ``(B, H, P + h*w, d)`` tokens laid out by ``grid_positions``; returns the
    same shape. Patch queries see their window and the prefix; prefix queries see everything."""
    height, width, prefix = grid_shape(positions)
    pre, grid = slice(0, prefix), slice(prefix, None)
    offsets = slot_offsets(window, q.device, dilation)
    neg = torch.finfo(q.dtype).min

    q_grid = q[:, :, grid]  # (B, H, N, d)
    k_win = gather_windows(k[:, :, grid], height, width, window, dilation)  # (B, H, N, K, d)
    v_win = gather_windows(v[:, :, grid], height, width, window, dilation)
    logits = torch.einsum("bhnd,bhnkd->bhnk", q_grid, k_win) * scale  # (B, H, N, K)
    logits = _plus(logits, encoding.window_bias(q_grid, k_win, offsets))
    logits = logits.masked_fill(~valid_slots(height, width, window, q.device, dilation), neg)
    if prefix:
        to_prefix = q_grid @ k[:, :, pre].transpose(-2, -1) * scale  # (B, H, N, P)
        to_prefix = _plus(
            to_prefix, encoding.bias(q_grid, k[:, :, pre], positions[grid], positions[pre])
        )
        logits = torch.cat([to_prefix, logits], dim=-1)  # (B, H, N, P + K)
    attn = logits.softmax(dim=-1)
    attn_pre, attn_win = attn[..., :prefix], attn[..., prefix:]
    out = torch.einsum("bhnk,bhnkd->bhnd", attn_win, v_win)
    out = _plus(out, encoding.window_value(attn_win, offsets))
    if prefix:
        out = out + attn_pre @ v[:, :, pre]
        out = _plus(out, encoding.value(attn_pre, positions[grid], positions[pre]))
        out = torch.cat(
            [global_attention(q[:, :, pre], k, v, encoding, positions, scale), out], dim=2
        )
    return out


def global_attention(
    q: Tensor, k: Tensor, v: Tensor, encoding: PositionEncoding, positions: Tensor, scale: float
) -> Tensor:
    """Prefix queries over every key, with the encoding's dense hooks."""
    q_pos = positions[: q.shape[2]]
    logits = _plus(q @ k.transpose(-2, -1) * scale, encoding.bias(q, k, q_pos, positions))
    attn = logits.softmax(dim=-1)
    return _plus(attn @ v, encoding.value(attn, q_pos, positions))

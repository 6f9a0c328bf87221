"""A content-free bias of the 2D offset (Swin, iRPE's bias mode) through the CPU flash kernel
with no ``(H, N, N)`` tensor, forward.

On a ``grid_positions`` layout (``positions.row_major_grid``: prefix tokens, then an R x C
grid in row-major order) the bias of a patch query and a patch key is ``T[dy, dx]`` of their
offset, a ``(H, 2R - 1, 2C - 1)`` table asked of the encoding once (four corner queries cover
every offset). Take the queries of one column ``x`` from the bottom row up: query ``r`` of that
column (row ``R - 1 - r``) and key ``j = y * C + x'`` read entry ``j + r * C`` of
``U[x] = T[:, :, C - 1 - x : 2C - 1 - x]`` laid out flat. So a column's whole bias is a strided
view of ``U[x]``, which the flash kernel reads in place (it takes ``attn_mask`` by its strides),
and ``U`` holds ``C`` tables of ``(2R - 1) x C``: about ``2 N C`` numbers per head instead of
``N^2`` (``(2R - 1) / R^2`` of it, so the saving shrinks on wide grids of few rows).

Prefix tokens are the pieces a view cannot hold: the prefix queries see every key with the
encoding's own (small, ``(H, P, N)``) bias, and the patches' view over the patch keys merges
with their bias over the prefix keys by the two log-sum-exps. The backward is the blocked
kernel's, asking the encoding for each block's bias (``kernels/blocked_bias.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu

# (q, k, q_pos, k_pos) -> (1, H, Nq, Nk): the encoding's own bias
Bias = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


class GridTable:
    """A grid bias as the flash kernel's views (``attend``); called, the encoding's own bias of
    any block (what the backward asks for)."""

    def __init__(self, bias: Bias, q: Tensor, positions: Tensor, layout: tuple[int, int, int]):
        self.bias, self.positions = bias, positions
        self.rows, self.cols, self.prefix = layout
        self._columns: Tensor | None = None
        self._probe = q[:1, :, :1]  # the encodings read q and k for their dtype and device only

    def serves(self, q_pos: Tensor, k_pos: Tensor, causal: bool) -> bool:
        """Self-attention without a mask over the positions this table was laid out for."""
        same = torch.equal(q_pos, self.positions) and torch.equal(k_pos, self.positions)
        return not causal and same

    def __call__(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        return self.bias(q, k, q_pos, k_pos)

    def offsets(self) -> Tensor:
        """``T``, ``(H, 2R - 1, 2C - 1)``: entry ``(R - 1 + dy, C - 1 + dx)`` is the bias of a key
        ``(dy, dx)`` from its query, read off the four corner queries' rows."""
        R, C, P = self.rows, self.cols, self.prefix
        grid = self.positions[P:]
        corners = grid[torch.tensor([0, C - 1, (R - 1) * C, R * C - 1])]
        with torch.no_grad():
            rows = self.bias(self._probe, self._probe, corners, grid)[0]  # (H, 4, R * C)
        rows = rows.unflatten(-1, (R, C))
        table = rows.new_empty(rows.shape[0], 2 * R - 1, 2 * C - 1)
        table[:, R - 1 :, C - 1 :] = rows[:, 0]  # from the top-left corner: dy, dx >= 0
        table[:, R - 1 :, :C] = rows[:, 1]  # top-right: dy >= 0, dx <= 0
        table[:, :R, C - 1 :] = rows[:, 2]
        table[:, :R, :C] = rows[:, 3]
        return table

    def column_views(self, dtype: torch.dtype) -> Tensor:
        """``(C, H, R, R * C)``: entry ``x`` is the bias of column ``x``'s queries, bottom row
        first, over the patch keys, a view of ``U[x]``."""
        if self._columns is None or self._columns.dtype != dtype:
            C = self.cols
            table = self.offsets().to(dtype)  # (H, 2R - 1, 2C - 1)
            # U[x] = T[:, :, C - 1 - x : 2C - 1 - x], one contiguous (H, 2R - 1, C) per column
            self._columns = table.unfold(2, C, 1).flip(2).permute(2, 0, 1, 3).contiguous()
        U = self._columns
        R, C = self.rows, self.cols
        return U.as_strided((C, U.shape[1], R, R * C), (U.stride(0), U.stride(1), C, 1))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, scale: float) -> tuple[Tensor, Tensor]:
        """Output ``(B, H, N, d)`` and log-sum-exp ``(B, H, N)`` of the biased attention. The
        columns go in as one batch per sample (the keys broadcast over them with stride 0):
        one call per column measured several times slower."""
        R, C, P = self.rows, self.cols, self.prefix
        pos = self.positions
        B, H, N, d = q.shape
        out, lse = q.new_empty(B, H, N, d), q.new_empty(B, H, N)
        q_grid, k_grid, v_grid = q[:, :, P:], k[:, :, P:], v[:, :, P:]
        grid_out = out[:, :, P:].unflatten(2, (R, C))  # (B, H, R, C, d), written in place
        grid_lse = lse[:, :, P:].unflatten(2, (R, C))
        views = self.column_views(q.dtype)
        for b in range(B):
            # the sample's queries by column, bottom row first: (C, H, R, d)
            by_column = q_grid[b].unflatten(1, (R, C)).permute(2, 0, 1, 3).flip(2)
            keys, values = (t[b : b + 1].expand(C, -1, -1, -1) for t in (k_grid, v_grid))
            o, l = _flash(by_column, keys, values, attn_mask=views, scale=scale)
            del by_column  # one copy of a sample's queries alive at a time
            grid_out[b] = o.flip(2).permute(1, 2, 0, 3)
            grid_lse[b] = l.flip(2).permute(1, 2, 0)
        if P:
            pre_bias = self.bias(q, k, pos[P:], pos[:P]).detach().to(q.dtype)  # (1, H, RC, P)
            o, l = _flash(q_grid, k[:, :, :P], v[:, :, :P], attn_mask=pre_bias, scale=scale)
            total = torch.logaddexp(lse[:, :, P:], l)
            out[:, :, P:].mul_((lse[:, :, P:] - total).exp_()[..., None])
            out[:, :, P:].add_(o.mul_((l - total).exp_()[..., None]))
            lse[:, :, P:] = total
            head_bias = self.bias(q, k, pos[:P], pos).detach().to(q.dtype)  # (1, H, P, N)
            out[:, :, :P], lse[:, :, :P] = _flash(
                q[:, :, :P], k, v, attn_mask=head_bias, scale=scale
            )
        self._columns = None  # the backward asks the encoding per block; free the slices now
        return out, lse

"""Swin Transformer's learned 2D relative position bias.

Liu et al. 2021, "Swin Transformer: Hierarchical Vision Transformer using Shifted Windows",
section 3.2: ``softmax(q k^T / sqrt(d) + B)``, with ``B`` read from a learned table of
``(2H - 1)(2W - 1)`` entries per head by the 2D offset between query and key.

Conventions:

- Offset = query minus key, ``dr = r_i - r_j``, ``dc = c_i - c_j``, as the reference code's
  ``coords[:, :, None] - coords[:, None, :]``; the entry is
  ``(dr + H - 1) * (2W - 1) + (dc + W - 1)`` with ``H x W`` the table's (largest) grid, so a
  Swin checkpoint's ``relative_position_bias_table`` for an ``H x W`` window loads unchanged.
- Initialised with a normal of std 0.02 truncated at +-2 (absolute), as the reference code.
- Deviation: Swin attends inside windows and has no class token. Here attention is global over
  the grid, and every pair involving a prefix (class) token, in either direction, reads one extra
  learned bias per head (``prefix_bias``), the shared prefix bucket of iRPE.
- A grid whose rows or columns span more than the table covers is an error, not a clamp.
- The bias is content-free, ``(1, H, Nq, Nk)``, so the fused attention path is kept. Each layer
  owns its table (``per_layer``), as in Swin.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc_cli.encodings.base import PositionEncoding, table_bias
from posenc_cli.errors import UsageError


def swin_index(q_pos: Tensor, k_pos: Tensor, height: int, width: int) -> Tensor:
    """Table entry of every (query, key) pair of grid positions, ``(Nq, Nk)``; pairs involving a
    prefix token ``(-1, -1)`` get ``(2H - 1)(2W - 1)``, one past the offset entries."""
    offset = q_pos[:, None, :] - k_pos[None, :, :]  # (Nq, Nk, 2): query minus key
    index = (offset[..., 0] + height - 1) * (2 * width - 1) + (offset[..., 1] + width - 1)
    prefix = (q_pos[:, None, 0] < 0) | (k_pos[None, :, 0] < 0)  # (Nq, Nk)
    return index.masked_fill(prefix, (2 * height - 1) * (2 * width - 1))


def grid_span(positions: Tensor) -> tuple[int, int]:
    """Rows and columns spanned by the grid tokens of ``positions`` (0, 0 if there are none)."""
    grid = positions[positions[:, 0] >= 0]  # (n, 2)
    if grid.numel() == 0:
        return 0, 0
    span = grid.max(dim=0).values - grid.min(dim=0).values + 1
    return int(span[0]), int(span[1])


class SwinBias(PositionEncoding):
    """Swin's learned bias per head and 2D offset, plus one bias for prefix-token pairs."""

    content_free = True  # the bias reads positions only
    toeplitz = True  # ... and depends on the 2D offset alone (and on prefix tokens)
    family = "bias"
    dims = 2
    extrapolates = False
    per_layer = True

    def __init__(
        self,
        *,
        height: int = 14,
        width: int = 14,
        heads: int = 8,
        head_dim: int = 64,
        causal: bool = False,
    ) -> None:
        super().__init__(heads=heads, head_dim=head_dim, causal=causal)
        if height < 1 or width < 1:
            raise UsageError(f"swin: height and width must be >= 1, got {height}x{width}")
        self.height, self.width = height, width
        entries = (2 * height - 1) * (2 * width - 1)
        self.table = nn.Parameter(torch.empty(entries, heads))  # ((2H-1)(2W-1), heads)
        self.prefix_bias = nn.Parameter(torch.empty(heads))  # (heads,)
        nn.init.trunc_normal_(self.table, std=0.02)
        nn.init.trunc_normal_(self.prefix_bias, std=0.02)

    def extra_repr(self) -> str:
        return f"grid={self.height}x{self.width}"

    def buckets(self, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, int]:
        entries = (2 * self.height - 1) * (2 * self.width - 1) + 1  # the last: prefix pairs
        return swin_index(q_pos, k_pos, self.height, self.width), entries

    def bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        if k_pos.dim() != 2:
            raise UsageError("swin: needs (row, col) grid positions; use t5 or alibi for sequences")
        rows, cols = grid_span(torch.cat([q_pos, k_pos]))
        if rows > self.height or cols > self.width:
            raise UsageError(
                f"swin: the grid spans {rows}x{cols} but the table covers "
                f"height={self.height}, width={self.width}; set height >= {rows}, width >= {cols}"
            )
        index = swin_index(q_pos, k_pos, self.height, self.width)  # (Nq, Nk)
        entries = torch.cat([self.table, self.prefix_bias[None]])  # (entries + 1, heads)
        return table_bias(entries.t(), index)  # (1, heads, Nq, Nk)

    def window_bias(self, q: Tensor, k: Tensor, offsets: Tensor, keys: Tensor) -> Tensor:
        reach = int(offsets.abs().max())
        if reach >= min(self.height, self.width):
            raise UsageError(
                f"swin: a window reaching {reach} patches needs a table with height and width "
                f"> {reach}, got height={self.height}, width={self.width}"
            )
        rows, cols = offsets[:, 0] + self.height - 1, offsets[:, 1] + self.width - 1
        index = rows * (2 * self.width - 1) + cols  # (K,)
        return self.table[index].T[None, :, None, :]  # (1, heads, 1, K)

"""What the GPU path (``kernels/flex.py``) needs from an encoding: its bias as a score_mod.

An encoding whose bias depends on the offset alone (``toeplitz``) is asked for it once per
distinct offset through its own ``bias`` hook, so no encoding writes FlexAttention code for it:
- 1D: the bias of one query at 0 against keys at every distance the pairs span;
- 2D grids: one query at each corner of the grid against every patch (together the four give
  every offset, each call inside the grid the encoding's table covers), and the three ways a
  prefix token takes part.
Other content-free encodings (FIRE, whose normaliser moves with the query) write their own
``score_mod``; content-dependent ones have none and take the other paths.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc_cli.encodings.base import PREFIX, PositionEncoding, grid_positions, grid_shape
from posenc_cli.kernels import flex


def per_head(encoding: PositionEncoding, q: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """The bias ``(H, Nq, Nk)`` in q's dtype, one slice per head even where heads share it."""
    bias = encoding.bias(q, q, q_pos, k_pos)[0]  # (H|1, Nq, Nk)
    return bias.expand(encoding.heads, -1, -1).to(q.dtype)


def distance_score_mod(encoding: PositionEncoding, q: Tensor, q_pos: Tensor, k_pos: Tensor):
    table, low = encoding.distance_table(q, q_pos, k_pos)  # (H, n)
    return flex.distance_mod(table, q_pos, k_pos, low)


def offset_score_mod(encoding: PositionEncoding, q: Tensor, q_pos: Tensor, k_pos: Tensor):
    height, width, _ = grid_shape(k_pos)
    patches = grid_positions(height, width, device=k_pos.device)  # (h*w, 2)
    table = q.new_zeros(2 * height - 1, 2 * width - 1, encoding.heads)
    for row in (0, height - 1):
        for col in (0, width - 1):
            corner = patches.new_tensor([[row, col]])
            values = per_head(encoding, q, corner, patches)[:, 0]  # (H, h*w)
            offsets = corner - patches  # query minus key
            index = (offsets[:, 0] + height - 1, offsets[:, 1] + width - 1)
            table = table.index_put(index, values.T)  # out of place: gradients reach the encoding
    prefix = patches.new_full((1, 2), PREFIX)
    origin = patches[:1]
    cases = [(prefix, origin), (origin, prefix), (prefix, prefix)]  # query, key, both prefix
    prefix_bias = torch.stack(
        [per_head(encoding, q, a, b)[:, 0, 0] for a, b in cases], dim=-1
    )  # (H, 3)
    return flex.offset_mod(table.permute(2, 0, 1), prefix_bias, q_pos, k_pos)


def score_mod_for(encoding: PositionEncoding, q: Tensor, q_pos: Tensor, k_pos: Tensor):
    """A content-free encoding's bias as a score_mod, or None if it has no such form."""
    if encoding.toeplitz:
        if k_pos.dim() == 1:
            return distance_score_mod(encoding, q, q_pos, k_pos)
        return offset_score_mod(encoding, q, q_pos, k_pos)
    return encoding.score_mod(q, q_pos, k_pos)

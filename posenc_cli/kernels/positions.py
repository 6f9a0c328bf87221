"""Facts about position tensors that the kernels, the encodings and the attention module ask
alike, spelled once."""

from __future__ import annotations

import torch
from torch import Tensor


def consecutive(positions: Tensor) -> bool:
    """1D positions ``start, start + 1, ...``: key ranges are then ranges of indices."""
    return positions.dim() == 1 and bool((positions.diff() == 1).all())


def increasing(positions: Tensor) -> bool:
    """1D positions in strictly increasing order: a causal mask by position then hides the
    later tokens by index too."""
    return positions.dim() == 1 and bool((positions.diff() > 0).all())


def padded_on_the_right(key_mask: Tensor) -> bool:
    """Every row of ``key_mask`` (B, N) real tokens first, then padding only."""
    real = key_mask.bool()
    return bool((real[:, 1:] <= real[:, :-1]).all())


def dense(positions: Tensor) -> bool:
    """1D positions about as dense as the tokens, so a table of every distance they span stays
    small (randomized positions may spread a few tokens over a range of millions)."""
    return positions.dim() == 1 and int(positions.max() - positions.min()) < 4 * len(positions)


def row_major_grid(positions: Tensor) -> tuple[int, int, int] | None:
    """``(rows, cols, prefix)`` when ``positions`` ``(N, 2)`` are prefix tokens (negative
    coordinates) followed by every patch of a grid of at least two rows from ``(0, 0)`` in
    row-major order, the layout of ``grid_positions``; else None."""
    if positions.dim() != 2 or positions.shape[-1] != 2:
        return None
    on_grid = positions[:, 0] >= 0
    prefix = int((~on_grid).sum())
    if prefix == len(positions) or bool(on_grid[:prefix].any()):
        return None
    rows, cols = (int(c) + 1 for c in positions[prefix:].max(dim=0).values)
    if rows < 2 or len(positions) != prefix + rows * cols:
        return None
    index = torch.arange(rows * cols, device=positions.device)
    expected = torch.stack([index // cols, index % cols], dim=-1)
    return (rows, cols, prefix) if torch.equal(positions[prefix:], expected) else None

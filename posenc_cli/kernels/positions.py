"""Facts about position tensors that the kernels, the encodings and the attention module ask
alike, spelled once."""

from __future__ import annotations

from torch import Tensor


def consecutive(positions: Tensor) -> bool:
    """1D positions ``start, start + 1, ...``: key ranges are then ranges of indices."""
    return positions.dim() == 1 and bool((positions.diff() == 1).all())


def dense(positions: Tensor) -> bool:
    """1D positions about as dense as the tokens, so a table of every distance they span stays
    small (randomized positions may spread a few tokens over a range of millions)."""
    return positions.dim() == 1 and int(positions.max() - positions.min()) < 4 * len(positions)

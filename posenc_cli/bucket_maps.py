"""Which bucket each relative position falls in, for ``posenc viz-buckets``.

Everything is read from the encodings' own ``buckets`` hook, so the picture shows exactly the ids
the attention uses. 1D: relative position (key - query) -> bucket id, plus the N x N map. 2D: the
bucket of every key patch for one query patch; iRPE's cross method has one map for rows and one
for columns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from posenc_cli.encodings import PositionEncoding
from posenc_cli.encodings.base import grid_positions
from posenc_cli.errors import UsageError


@dataclass
class BucketMap:
    title: str
    ids: Tensor  # 1D: (2N - 1,) over relative positions -(N-1)..(N-1); 2D: (H, W)
    count: int
    full: Tensor | None = None  # 1D only: (N, N), query rows, key columns
    query: tuple[int, int] | None = None  # 2D only
    params: dict = field(default_factory=dict)

    @property
    def used(self) -> int:
        return int(self.ids.unique().numel())


def sequence_buckets(encoding: PositionEncoding, length: int, title: str) -> BucketMap:
    pos = torch.arange(length)
    found = encoding.buckets(pos, pos)
    if found is None:
        raise UsageError(
            f"{title}: this encoding has no buckets; try t5, shaw or deberta (see posenc list)"
        )
    full, count = found
    # the last query sees keys at every relative position -(N-1)..0, the first one 0..N-1
    relative = torch.cat([full[-1], full[0, 1:]])  # (2N - 1,)
    return BucketMap(title, relative, count, full=full)


def grid_buckets(
    encoding: PositionEncoding, height: int, width: int, query: tuple[int, int], title: str
) -> list[BucketMap]:
    q_pos = torch.tensor([query])
    k_pos = grid_positions(height, width)
    found = encoding.buckets(q_pos, k_pos)
    if found is None:
        raise UsageError(
            f"{title}: this encoding has no buckets; try irpe or swin (see posenc list)"
        )
    ids, count = found
    if getattr(encoding, "method", None) == "cross":  # iRPE cross: a row map and a column map
        ids = torch.stack(encoding.map_ids(q_pos, k_pos)[:2])  # (2, 1, H*W)
    if ids.dim() == 3:
        return [
            BucketMap(f"{title} rows", ids[0].reshape(height, width), count, query=query),
            BucketMap(f"{title} columns", ids[1].reshape(height, width), count, query=query),
        ]
    return [BucketMap(title, ids.reshape(height, width), count, query=query)]


def scaled_grids(height: int, width: int, cells: Sequence[int]) -> list[tuple[int, int]]:
    """Grids of the shape ``height x width`` scaled down to about ``cells`` patches each: small
    versions of a grid, to measure what it will cost (rows, columns and patches all grow with
    the scale, so the cost is a polynomial in it)."""
    grids = []
    for target in cells:
        scale = (target / (height * width)) ** 0.5
        grid = max(1, round(height * scale)), max(1, round(width * scale))
        if grid not in grids:
            grids.append(grid)
    return grids


def parse_grid(text: str) -> tuple[int, int]:
    parts = text.lower().split("x")
    try:
        height, width = (int(p) for p in parts)
    except ValueError:
        raise UsageError(f"--grid {text!r}: write HEIGHTxWIDTH, for example 14x14") from None
    if height < 1 or width < 1:
        raise UsageError(f"--grid {text}: both sides must be at least 1, for example 14x14")
    return height, width


def parse_query(text: str | None, height: int, width: int) -> tuple[int, int]:
    if text is None:
        return height // 2, width // 2
    try:
        row, col = (int(p) for p in text.split(","))
    except ValueError:
        raise UsageError(f"--query {text!r}: write ROW,COL, for example 7,7") from None
    if not (0 <= row < height and 0 <= col < width):
        raise UsageError(
            f"--query {text}: outside the {height}x{width} grid (rows and columns count from 0)"
        )
    return row, col

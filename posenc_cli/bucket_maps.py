"""Which bucket each relative position falls in, for ``posenc viz-buckets``.

Everything is read from the encodings' own ``buckets`` hook, so the picture shows exactly the ids
the attention uses. 1D: relative position (key - query) -> bucket id, plus the N x N map. 2D: the
bucket of every key patch for one query patch; iRPE's cross method has one map for rows and one
for columns. Video (N-D encodings on ``(t, row, col)``): the same for one query patch of a clip,
one map per frame; for ``irpe_nd``'s cross method the ids of its one merged table.
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
    mark_query: bool = True  # 2D: outline the query cell (video: only in the query's frame)

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


def clip_buckets(
    encoding: PositionEncoding, shape: tuple[int, int, int], query: tuple[int, int, int],
    title: str,
) -> list[BucketMap]:  # fmt: skip
    """One map per frame of a ``frames x height x width`` clip: the bucket of every key patch
    for the query patch ``(t, row, col)``."""
    if encoding.axes != 3:
        raise UsageError(
            f"{title}: a clip needs an encoding on (t, row, col); this one reads {encoding.axes} "
            f"axes (give --grid HxW, or build it with axes=3)"
        )
    frames, height, width = shape
    axes = [torch.arange(n) for n in shape]
    k_pos = torch.stack(torch.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 3)
    q_pos = torch.tensor([query])
    found = encoding.buckets(q_pos, k_pos)
    if found is None:
        raise UsageError(f"{title}: this encoding has no buckets; try irpe_nd (see posenc list)")
    ids, count = found
    if getattr(encoding, "method", None) == "cross":  # one merged id per axis combination
        ids, count = encoding.pair_bucket_ids(q_pos, k_pos)[0], encoding.sides[0] ** 3 + 1
    per_frame = ids.reshape(frames, height, width)
    t, row, col = query
    return [
        BucketMap(f"{title} frame {f}", per_frame[f], count, query=(row, col), mark_query=f == t)
        for f in range(frames)
    ]


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


def parse_grid(text: str, sides: int = 2) -> tuple[int, ...]:
    """``HxW`` (or ``TxHxW`` for a clip, ``sides=3``) as integers."""
    example = "14x14" if sides == 2 else "4x8x8"
    shape = "HEIGHTxWIDTH" if sides == 2 else "FRAMESxHEIGHTxWIDTH"
    try:
        sizes = tuple(int(p) for p in text.lower().split("x"))
    except ValueError:
        sizes = ()
    if len(sizes) != sides:
        raise UsageError(f"--grid {text!r}: write {shape}, for example {example}")
    if min(sizes) < 1:
        every = "both sides" if sides == 2 else "every side"
        raise UsageError(f"--grid {text}: {every} must be at least 1, for example {example}")
    return sizes


def parse_query(text: str | None, *shape: int) -> tuple[int, ...]:
    """``ROW,COL`` on a grid (``T,ROW,COL`` on a clip); the centre when not given."""
    if text is None:
        return tuple(n // 2 for n in shape)
    form = "ROW,COL" if len(shape) == 2 else "T,ROW,COL"
    try:
        where = tuple(int(p) for p in text.split(","))
    except ValueError:
        where = ()
    if len(where) != len(shape):
        example = ",".join(str(n // 2) for n in shape)
        raise UsageError(f"--query {text!r}: write {form}, for example {example}")
    if not all(0 <= w < n for w, n in zip(where, shape, strict=True)):
        grid = "x".join(str(n) for n in shape)
        raise UsageError(f"--query {text}: outside the {grid} grid (every index counts from 0)")
    return where

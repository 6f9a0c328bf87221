"""Which ids the (query, key) pairs and window slots of iRPE read, from positions: offsets
looked up in an offset table, the prefix bucket, the one merged gather of the cross method, and
the soft reads of learned breakpoints. Plain tensors; the tables and the terms live in
``irpe.py``."""

from __future__ import annotations

import torch
from torch import Tensor

from posenc_cli.kernels import soft_index

Pairs = list[tuple[Tensor, Tensor | None]]  # (ids, weight or None = 1) read and summed


def soft_reads(x: Tensor, alpha: Tensor, beta: float, gamma: Tensor) -> Pairs:
    """The two ``(ids, weight)`` reads of the soft index of ``x`` (ids shifted by
    ``int(beta)`` as the fixed ones): ``soft_index.piecewise_index`` between its neighbours."""
    B = int(beta)
    u = soft_index.piecewise_index(x.double(), alpha, beta, gamma) + B
    lo, hi, w = soft_index.neighbours(u, 2 * B)
    return [(lo, 1 - w), (hi, w)]


def grid_reach(*positions: Tensor) -> tuple[int, int]:
    """Largest row and column distance between any two grid tokens of ``positions``."""
    coords = torch.cat(positions)  # (n, 2)
    coords = coords[coords[:, 0] >= 0]
    if len(coords) == 0:
        return 0, 0
    span = coords.max(dim=0).values - coords.min(dim=0).values  # (2,)
    return int(span[0]), int(span[1])


def lookup_offsets(table: Tensor, offsets: Tensor) -> Tensor:
    """Bucket id of every ``(..., 2)`` offset, read from a ``bucket_table`` ``(2h-1, 2w-1)``."""
    h, w = (table.shape[0] + 1) // 2, (table.shape[1] + 1) // 2
    return table[offsets[..., 0] + h - 1, offsets[..., 1] + w - 1]


def pair_ids(table: Tensor, q_pos: Tensor, k_pos: Tensor, prefix_id: int) -> Tensor:
    """Bucket id of every (query, key) pair, ``(Nq, Nk)``: the offset ``q - k`` looked up in
    ``table``, and ``prefix_id`` wherever either token is a prefix token."""
    offsets = q_pos[:, None, :] - k_pos[None, :, :]  # (Nq, Nk, 2), query minus key
    prefix = (q_pos[:, None, 0] < 0) | (k_pos[None, :, 0] < 0)  # (Nq, Nk)
    offsets = offsets.masked_fill(prefix[..., None], 0)  # keep prefix pairs inside the table
    return lookup_offsets(table, offsets).masked_fill(prefix, prefix_id)


def merged_cross_ids(per_axis: list[Tensor], side: int) -> Tensor:
    """One id per pair from the per-axis ids of ``cross``: the digits ``id_a`` in base
    ``side``, and ``side^A`` for prefix pairs (their id is ``side`` on every axis). The gather
    is then the same as product's, into ``merged_cross_table``."""
    ids = per_axis[0]
    for axis_ids in per_axis[1:]:
        ids = ids * side + axis_ids
    return torch.where(per_axis[0] == side, side ** len(per_axis), ids)


def merged_cross_table(tables: list[Tensor], axis: int) -> Tensor:
    """Entry ``merged_cross_ids`` of the sum of the axis tables (bucket axis ``axis`` of each,
    ``side + 1`` long with the prefix entry last): every combination of grid buckets, then the
    sum of the prefix entries."""
    moved = [t.movedim(axis, -1) for t in tables]
    side = moved[0].shape[-1] - 1
    grid = moved[0][..., :side]
    for t in moved[1:]:
        grid = (grid[..., :, None] + t[..., None, :side]).flatten(-2)
    prefix = sum(t[..., side:] for t in moved)
    return torch.cat([grid, prefix], dim=-1).movedim(-1, axis)

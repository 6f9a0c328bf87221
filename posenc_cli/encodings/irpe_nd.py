"""iRPE on any number of axes: one relative encoding for text, images, spectrograms and video.

The source article's first future direction (``000_*.txt`` section 5): one relative position
framework across modalities. iRPE's piecewise index (Wu et al. 2021, Eq. 18) runs on every axis
of a position ``(N, A)``: ``A = 1`` a sequence, 2 an image grid or a time x frequency
spectrogram, 3 a video ``(t, row, col)``. With ``o`` the offset query minus key and
``g`` the piecewise index, ``B = int(beta)`` and ``S = 2B + 1``:

- ``product``: one bucket per combination of axis buckets, ``sum_a (g(o_a) + B) S^(A-1-a)``,
  ``S^A`` buckets (49 for an image, 343 for video at the default ratio);
- ``cross``: one table per axis, indexed by ``g(o_a) + B``, the lookups summed;
- ``euclidean``: ``g(round(sqrt(sum_a o_a^2))) + B``; ``quant``: ``g(sum_a o_a^2) + B``.

Everything else is ``irpe``'s (``ImageRPE``): bias or contextual terms on q, k and v, tables per
head or shared, several index scales, one shared bucket for every pair with a prefix token, the
hand-written contextual kernel, and no ``(N, N, d)`` tensor. With ``A = 2`` the ids and outputs
are exactly ``irpe``'s (tested), and with ``A = 1`` it is a 1D piecewise relative encoding.

Positions: ``(N, A)`` integer coordinates, prefix tokens at -1 on every axis; ``(N,)`` puts a
token at that value on every axis, M-RoPE's rule for text tokens (``t = h = w``), so text and
grid tokens can share one sequence (``mrope_positions`` builds such positions). Ids are computed
once per offset of the span the positions cover, then gathered per pair, as in ``irpe``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from posenc_cli.encodings.irpe import ImageRPE, Method, Mode, On
from posenc_cli.encodings.irpe_index import DEFAULT_RATIO, piecewise_index
from posenc_cli.encodings.irpe_pairs import merged_cross_ids, merged_cross_table
from posenc_cli.errors import UsageError

MAX_AXES = 4  # product buckets grow as S^A: 2401 at A = 4, past that a table per axis is wiser


def axis_coordinates(positions: Tensor, axes: int) -> Tensor:
    """``(N, axes)`` coordinates: ``(N,)`` positions are put at that value on every axis."""
    if positions.dim() == 1:
        return positions[:, None].expand(-1, axes)
    if positions.dim() != 2 or positions.shape[-1] != axes:
        raise UsageError(
            f"irpe_nd: positions of shape {tuple(positions.shape)} do not have {axes} axes; give "
            f"(N,) or (N, {axes}) positions, or set irpe_nd.axes to their number of axes"
        )
    return positions


def offset_ids(
    method: Method, offsets: Tensor, alpha: float, beta: float, gamma: float
) -> list[Tensor]:
    """Bucket id of every ``(..., A)`` offset: one tensor, or one per axis for ``cross``."""
    B = int(beta)
    side = 2 * B + 1

    def g(x: Tensor) -> Tensor:
        return piecewise_index(x, alpha, beta, gamma)

    squared = (offsets * offsets).sum(-1)  # int64, as irpe_index
    if method == "euclidean":
        return [g(squared.float().sqrt().round()) + B]  # float32 like the official code
    if method == "quant":
        return [g(squared) + B]
    per_axis = [g(offsets[..., a]) + B for a in range(offsets.shape[-1])]
    if method == "cross":
        return per_axis
    ids = per_axis[0]
    for axis_ids in per_axis[1:]:
        ids = ids * side + axis_ids  # product: the axis buckets as the digits of one number
    return [ids]


class RelativeND(ImageRPE):
    """iRPE's terms on the buckets of an offset with any number of axes (see module docs)."""

    dims = 3  # any number of axes, like mrope

    def __init__(
        self,
        *,
        axes: int = 3,
        method: Method = "product",
        mode: Mode = "contextual",
        on: On = "k",
        shared_head: bool = True,
        ratio: float = DEFAULT_RATIO,
        alpha: float | None = None,
        beta: float | None = None,
        gamma: float | None = None,
        ratios: list[float] | None = None,
        heads: int = 8,
        head_dim: int = 64,
        causal: bool = False,
    ) -> None:
        if not 1 <= axes <= MAX_AXES:
            raise UsageError(
                f"irpe_nd: axes must be 1 to {MAX_AXES}, got {axes}; 1 for text, 2 for images "
                f"and spectrograms, 3 for video"
            )
        super().__init__(
            method=method, mode=mode, on=on, shared_head=shared_head, ratio=ratio, alpha=alpha,
            beta=beta, gamma=gamma, ratios=ratios, heads=heads, head_dim=head_dim, causal=causal,
        )  # fmt: skip
        self.axes = axes
        # irpe's tables are sized for two axes; product and cross change with the axis count,
        # so the tables are made again
        self.sides = [2 * int(beta) + 1 for _, beta, _ in self.scales]
        per_table = [s**axes if method == "product" else s for s in self.sides]
        self.counts = [c + 1 for c in per_table]  # + the prefix bucket, id count - 1
        self.maps = tuple(f"axis{a}" for a in range(axes)) if method == "cross" else ("",)
        self.tables = self.zero_tables()

    @property
    def toeplitz(self) -> bool:
        """False: its bias is a function of the offset, but a 1D distance table would pass
        negative "positions", which read as prefix tokens here."""
        return False

    def extra_repr(self) -> str:
        return f"axes={self.axes}, " + super().extra_repr()

    # --- bucket ids (the rest of ImageRPE reads them through these) ---------------------------

    def _offset_ids(self, offsets: Tensor) -> list[Tensor]:
        """Ids of every (scale, map) for ``(..., A)`` offsets."""
        return [ids for params in self.scales for ids in offset_ids(self.method, offsets, *params)]

    def _merge_maps(self, ids: list[Tensor]) -> list[Tensor]:
        if self.method != "cross":
            return ids
        n = self.axes
        return [
            merged_cross_ids(ids[s * n : (s + 1) * n], side) for s, side in enumerate(self.sides)
        ]

    def map_ids(self, q_pos: Tensor, k_pos: Tensor) -> list[Tensor]:
        """``(Nq, Nk)`` ids of every (scale, map): each offset's id computed once over the box
        of offsets the positions span, then gathered per pair. Where that box holds more
        offsets than there are pairs (text on every axis, ``t = h = w``: its offsets lie on a
        diagonal of an N^3 box), the pairs' own offsets are read instead."""
        q, k = axis_coordinates(q_pos, self.axes), axis_coordinates(k_pos, self.axes)
        prefix_q, prefix_k = q[:, 0] < 0, k[:, 0] < 0
        on_grid = torch.cat([q[~prefix_q], k[~prefix_k]])
        spans = (on_grid.amax(0) - on_grid.amin(0)).tolist() if len(on_grid) else [0] * self.axes
        offsets = q[:, None, :] - k[None, :, :]  # (Nq, Nk, A), query minus key
        prefix = prefix_q[:, None] | prefix_k[None, :]
        offsets = offsets.masked_fill(prefix[..., None], 0)  # keep prefix pairs in the table
        counts = [c for c in self.counts for _ in self.maps]  # per (scale, map)
        if math.prod(2 * s + 1 for s in spans) > prefix.numel():
            tables = self._offset_ids(offsets)
            return [t.masked_fill(prefix, c - 1) for t, c in zip(tables, counts, strict=True)]
        ranges = [torch.arange(-s, s + 1, device=q.device) for s in spans]
        every = torch.stack(torch.meshgrid(*ranges, indexing="ij"), -1).reshape(-1, self.axes)
        strides = [math.prod(2 * s + 1 for s in spans[a + 1 :]) for a in range(self.axes)]
        strides_t = torch.tensor(strides, device=q.device)
        flat = ((offsets + torch.tensor(spans, device=q.device)) * strides_t).sum(-1)
        tables = self._offset_ids(every)
        return [t[flat].masked_fill(prefix, c - 1) for t, c in zip(tables, counts, strict=True)]

    def slot_bucket_ids(self, offsets: Tensor) -> list[Tensor]:
        """``(K,)`` ids of window slots at ``(K, A)`` offsets, query minus key."""
        return self._merge_maps(self._offset_ids(offsets))

    def _letter_tables(self, letter: str) -> list[Tensor]:
        if self.method != "cross":
            return super()._letter_tables(letter)
        axis = -2 if letter == "v" and self.mode == "contextual" else -1  # the bucket axis
        per_scale = [
            [self.tables[self.table_name(letter, s, m)] for m in self.maps]
            for s in range(len(self.scales))
        ]
        return [merged_cross_table(tables, axis) for tables in per_scale]


__all__ = ["RelativeND", "axis_coordinates", "offset_ids"]

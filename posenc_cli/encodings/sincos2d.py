"""Fixed 2D sinusoid for image grids, as DETR builds it.

Carion et al. 2020, "End-to-End Object Detection with Transformers" (DETR), and its reference
``PositionEmbeddingSine``. With ``F = dim / 2`` channels per axis and pair ``i = 0 .. F/2 - 1``:

    channel 2i     of an axis = sin(t / T^(2i / F))
    channel 2i + 1 of an axis = cos(t / T^(2i / F))        (T = temperature, 10000)

Conventions (all as DETR's code does, tested against a scalar re-derivation):

- Channel layout: the first ``dim/2`` channels encode the row (y), the last ``dim/2`` the column
  (x). Within each half sin and cos alternate (DETR stacks ``sin`` of the even and ``cos`` of the
  odd frequency slots on a new last axis and flattens), so the two channels of a pair share one
  frequency. ``dim`` must be divisible by 4 (DETR's stack needs an even ``F``).
- Coordinates count from 1: DETR takes the cumulative sum of the not-padded mask, so row ``r``
  (0-based) has ``t = r + 1``. With ``normalize`` (DETR's setting for its encoder) the coordinate
  is divided by the last cumulative value plus ``eps = 1e-6`` and multiplied by ``2 pi``; for a
  full, unpadded ``H x W`` grid that is ``y = (r + 1) / (H + 1e-6) * 2 pi`` and
  ``x = (c + 1) / (W + 1e-6) * 2 pi``. There is no padding mask here: ``H`` and ``W`` are the grid
  spanned by the positions (``grid_shape``), so different image sizes map to the same range.
- ``where="input"`` adds the table once to the tokens (ViT style); ``where="qk"`` returns it from
  ``qk_input`` so the attention module adds it to the query and key inputs, not to the values, in
  every layer, as DETR's encoder does (``q = k = src + pos``, ``v = src``).
- Prefix (class) tokens at ``(-1, -1)`` get a zero embedding: they have no place on the grid.
- Computed in float64 and cast by the caller; no parameters, shared by every layer.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from posenc_cli.encodings.base import PositionEncoding, grid_shape
from posenc_cli.errors import UsageError

Where = Literal["input", "qk"]

_EPS = 1e-6  # DETR's guard in the normalisation denominator
_SCALE = 2 * math.pi  # DETR's default scale when normalising


def axis_sinusoid(coord: Tensor, feats: int, temperature: float = 10000.0) -> Tensor:
    """One axis of DETR's embedding, ``(N,) -> (N, feats)``: sin/cos interleaved per pair."""
    pair = torch.arange(feats // 2, dtype=torch.float64, device=coord.device)  # i
    angle = coord.to(torch.float64)[:, None] / temperature ** (2 * pair / feats)  # (N, F/2)
    return torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(-2)  # (N, F)


def sincos2d_at(
    rows: Tensor,
    cols: Tensor,
    height: int,
    width: int,
    dim: int,
    temperature: float = 10000.0,
    normalize: bool = True,
) -> Tensor:
    """DETR's embedding at 0-based grid coordinates ``rows``, ``cols`` ``(N,)`` of an
    ``height x width`` grid, float64 ``(N, dim)``: row half first, then column half."""
    y = rows.to(torch.float64) + 1  # DETR's cumulative sum counts from 1
    x = cols.to(torch.float64) + 1
    if normalize:
        y = y / (height + _EPS) * _SCALE
        x = x / (width + _EPS) * _SCALE
    half = dim // 2
    return torch.cat([axis_sinusoid(y, half, temperature), axis_sinusoid(x, half, temperature)], -1)


def sincos2d_table(
    height: int, width: int, dim: int, temperature: float = 10000.0, normalize: bool = True
) -> Tensor:
    """The full grid in row-major order, float64 ``(height * width, dim)``."""
    rows = torch.arange(height).repeat_interleave(width)  # (H*W,)
    cols = torch.arange(width).repeat(height)  # (H*W,)
    return sincos2d_at(rows, cols, height, width, dim, temperature, normalize)


class SinCos2D(PositionEncoding):
    """DETR's fixed 2D sinusoid, at the input or added to q/k inputs in every layer."""

    family = "absolute"
    dims = 2
    extrapolates = True
    per_layer = False

    def __init__(
        self,
        *,
        dim: int = 256,
        where: Where = "input",
        normalize: bool = True,
        temperature: float = 10000.0,
        heads: int = 8,
        head_dim: int = 64,
        causal: bool = False,
    ) -> None:
        super().__init__(heads=heads, head_dim=head_dim, causal=causal)
        if dim < 4 or dim % 4:
            raise UsageError(
                f"sincos2d: dim must be a multiple of 4 (sin/cos pairs for rows and columns), "
                f"got {dim}; change the model width"
            )
        if where not in ("input", "qk"):
            raise UsageError(f"sincos2d: where must be 'input' or 'qk', got {where!r}")
        if temperature <= 1:
            raise UsageError(f"sincos2d: temperature must be > 1, got {temperature}")
        self.dim = dim
        self.where: Where = where
        self.normalize = normalize
        self.temperature = temperature

    def extra_repr(self) -> str:
        return f"dim={self.dim}, where={self.where}, normalize={self.normalize}"

    def table(self, positions: Tensor) -> Tensor:
        """Float64 ``(N, dim)`` at grid ``positions`` ``(N, 2)``; prefix rows are zero."""
        if positions.dim() != 2:
            raise UsageError("sincos2d: needs (row, col) grid positions; use it in an image model")
        height, width, _ = grid_shape(positions)
        on_grid = positions[:, 0] >= 0  # (N,)
        rows, cols = positions[:, 0].clamp(min=0), positions[:, 1].clamp(min=0)
        out = sincos2d_at(
            rows, cols, height, width, self.dim, self.temperature, self.normalize
        )  # (N, dim)
        return out * on_grid[:, None]

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        if self.where != "input":
            return x
        return x + self.table(positions).to(x.dtype)

    def qk_input(self, positions: Tensor) -> Tensor | None:
        return self.table(positions) if self.where == "qk" else None

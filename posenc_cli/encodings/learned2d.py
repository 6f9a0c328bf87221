"""Learned absolute table for image grids, resized when the grid changes.

Touvron et al. 2021, "Training data-efficient image transformers & distillation through
attention" (DeiT), following ViT: one learned vector per token, ``(prefix_tokens + H*W, dim)``,
where the prefix rows belong to the class (and distillation) tokens. Initialised with a normal of
std 0.02 truncated at +-2 (absolute, so in effect untruncated), as timm does.

Conventions:

- A grid of another size at call time (fine-tuning at 384 px from a 224 px table) reads the patch
  rows resized by bicubic interpolation (``timm.layers.resample_abs_pos_embed``, which works in
  float32); the prefix rows are used unchanged. The resized table is recomputed on every call so
  that the gradient reaches the stored one.
- ``antialias=False`` (default) is DeiT's own fine-tuning code: ``F.interpolate(mode="bicubic",
  align_corners=False)``. timm passes ``antialias=True``, which uses a different cubic kernel
  (a = -0.5 instead of -0.75) and low-pass filters when shrinking; set it to reproduce timm.
- Tokens are looked up by position, so any subset or order of ``grid_positions`` works; prefix
  tokens at ``(-1, -1)`` take the prefix rows in the order they appear. A number of prefix tokens
  other than the table's is an error: a class token has no row to interpolate from.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc_cli.encodings.base import PositionEncoding, grid_shape
from posenc_cli.errors import UsageError


def grid_rows(positions: Tensor, width: int, prefix: int) -> Tensor:
    """Row of a ``(prefix + H*width, dim)`` table for each ``(row, col)``, ``(N,)``: the k-th
    prefix token reads row k, patch ``(r, c)`` reads ``prefix + r * width + c``."""
    on_grid = positions[:, 0] >= 0  # (N,)
    prefix_rank = torch.cumsum(~on_grid, dim=0) - 1  # k for the k-th prefix token
    patch = prefix + positions[:, 0] * width + positions[:, 1]
    return torch.where(on_grid, patch, prefix_rank)


class Learned2D(PositionEncoding):
    """DeiT's learned position table with bicubic resizing to other grids."""

    family = "absolute"
    dims = 2
    extrapolates = False  # it resizes, which works but is not the trained table
    per_layer = False

    def __init__(
        self,
        *,
        dim: int = 192,
        height: int = 14,
        width: int = 14,
        prefix_tokens: int = 1,
        antialias: bool = False,
        heads: int = 8,
        head_dim: int = 64,
        causal: bool = False,
    ) -> None:
        super().__init__(heads=heads, head_dim=head_dim, causal=causal)
        if height < 1 or width < 1:
            raise UsageError(f"learned2d: height and width must be >= 1, got {height}x{width}")
        if prefix_tokens < 0:
            raise UsageError(f"learned2d: prefix_tokens must be >= 0, got {prefix_tokens}")
        self.height, self.width = height, width
        self.prefix_tokens = prefix_tokens
        self.antialias = antialias
        self.table = nn.Parameter(torch.empty(prefix_tokens + height * width, dim))  # (P+H*W, D)
        nn.init.trunc_normal_(self.table, std=0.02)

    def extra_repr(self) -> str:
        return f"grid={self.height}x{self.width}, prefix_tokens={self.prefix_tokens}"

    def resized(self, height: int, width: int) -> Tensor:
        """The table for an ``height x width`` grid, ``(P + height*width, dim)``; a grid of prefix
        tokens only reads the prefix rows of the stored table."""
        if (height, width) == (self.height, self.width) or height * width == 0:
            return self.table
        # imported here: timm (and the torchvision it pulls in) adds seconds to every CLI start
        from timm.layers import resample_abs_pos_embed

        return resample_abs_pos_embed(
            self.table[None],
            new_size=[height, width],
            old_size=[self.height, self.width],
            num_prefix_tokens=self.prefix_tokens,
            interpolation="bicubic",
            antialias=self.antialias,
        )[0]

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        if positions.dim() != 2:
            raise UsageError("learned2d: needs (row, col) grid positions; use it in an image model")
        height, width, prefix = grid_shape(positions)
        if prefix != self.prefix_tokens:
            raise UsageError(
                f"learned2d: the input has {prefix} prefix tokens but the table has "
                f"{self.prefix_tokens}; set prefix_tokens={prefix}"
            )
        table = self.resized(height, width)
        return x + table[grid_rows(positions, width, prefix)].to(x.dtype)

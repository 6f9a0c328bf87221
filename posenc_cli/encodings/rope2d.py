"""2D rotary position embedding for image grids (RoPE-Axial and RoPE-Mixed).

Heo et al. 2024, "Rotary Position Embedding for Vision Transformer" (RoPE-ViT), and its reference
code (naver-ai/rope-vit). Each head's ``d/2`` channel pairs are turned by an angle that depends on
the token's (row, col), so ``q . k`` depends on the 2D offset only.

- ``axial``: pairs ``0 .. d/4 - 1`` turn by ``col * f_i``, pairs ``d/4 .. d/2 - 1`` by
  ``row * f_i``, with ``f_i = base^(-4i/d)`` (1D RoPE frequencies over ``d/2`` channels per
  axis). The column comes first as in the reference code (``cat([freqs_x, freqs_y])``, x being
  the column); the order is a fixed channel permutation, absorbed by W_q and W_k when training.
  Shared by every layer, no parameters; the reference's theta is 100.
- ``mixed``: learnable frequencies per head, ``(H, d/2)`` for rows and for columns, and the angle
  of pair ``j`` is ``f_row[h, j] * row + f_col[h, j] * col``. Initialised as the reference's
  ``init_random_2d_freqs``: per head a random direction ``a ~ U(0, 2 pi)``, magnitudes
  ``m_i = base^(-4i/d)`` for ``i < d/4``; pair ``i`` gets ``m_i (cos a, sin a)`` and pair
  ``d/4 + i`` gets ``m_i (cos(a + pi/2), sin(a + pi/2))`` as (column, row) frequencies. The
  reference's theta for mixed is 10. Every layer owns its frequencies, as in the reference.

Conventions:

- ``base=None`` (default) takes the paper's value for the variant: 100 for axial, 10 for mixed.
- Pairs are interleaved, ``(x0, x1), (x2, x3), ...``, as the reference code's complex view and
  ``rope.py``'s ``layout="interleaved"``; the rotation itself is ``kernels.rotary.rotate_pairs``.
- Coordinates are 0-based (row, col) from ``grid_positions``. Prefix (class) tokens at
  ``(-1, -1)`` are not rotated, as the reference skips token 0: their angle is forced to 0.
- ``per_layer`` is True for the class because the mixed variant has per-layer parameters; an
  axial instance per layer costs only its ``(N, d/2)`` tables.
- Axial angles are computed in float64; mixed angles in the parameters' dtype, at least float32
  (the reference turns autocast off for them). Tables are cast to the dtype of q and k.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

from posenc_cli.encodings.base import PositionEncoding
from posenc_cli.encodings.rope import rope_frequencies
from posenc_cli.errors import UsageError
from posenc_cli.kernels.rotary import rotate_pairs

Variant = Literal["axial", "mixed"]

PAPER_BASE = {"axial": 100.0, "mixed": 10.0}  # RoPE-ViT's rope_theta per variant


def axis_frequencies(head_dim: int, base: float) -> Tensor:
    """``base^(-4i/d)`` for ``i = 0 .. d/4 - 1``, float64 ``(d/4,)``: the 1D RoPE frequencies of
    a ``d/2``-channel rotation, one set per axis."""
    return rope_frequencies(head_dim // 2, base)


def axial_angles(positions: Tensor, freqs: Tensor) -> Tensor:
    """Float64 ``(N, d/2)``: ``col * f`` on the first half of the pairs, ``row * f`` on the
    second; a prefix token ``(-1, -1)`` gets angle 0."""
    grid = positions.clamp(min=0).to(torch.float64)  # (N, 2); prefix -> (0, 0) -> angle 0
    freqs = freqs.to(positions.device, torch.float64)
    return torch.cat([grid[:, 1:2] * freqs, grid[:, 0:1] * freqs], dim=-1)  # (N, d/2)


def mixed_init(
    heads: int, head_dim: int, base: float, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """RoPE-Mixed's initial (row, col) frequencies, each float64 ``(H, d/2)``."""
    mag = axis_frequencies(head_dim, base)  # (d/4,)
    a = torch.rand(heads, 1, generator=generator, dtype=torch.float64) * 2 * math.pi  # (H, 1)
    col = torch.cat([mag * torch.cos(a), mag * torch.cos(a + math.pi / 2)], dim=-1)  # (H, d/2)
    row = torch.cat([mag * torch.sin(a), mag * torch.sin(a + math.pi / 2)], dim=-1)  # (H, d/2)
    return row, col


def mixed_angles(positions: Tensor, row_freqs: Tensor, col_freqs: Tensor) -> Tensor:
    """``row * f_row[h] + col * f_col[h]`` per head, ``(H, N, d/2)``; prefix tokens get 0."""
    dtype = torch.promote_types(row_freqs.dtype, torch.float32)
    grid = positions.clamp(min=0).to(dtype)  # (N, 2)
    rows, cols = grid[None, :, 0:1], grid[None, :, 1:2]  # (1, N, 1)
    return rows * row_freqs.to(dtype)[:, None] + cols * col_freqs.to(dtype)[:, None]


def _queries_are_key_tail(q_pos: Tensor, k_pos: Tensor) -> bool:
    """Whether ``q_pos`` is the view ``k_pos[-Nq:]`` (Attention's contract), so the key tables can
    be sliced instead of recomputed; checked without reading the values."""
    nq = q_pos.shape[0]
    tail = k_pos[k_pos.shape[0] - nq :]
    return q_pos is k_pos or (
        q_pos.data_ptr() == tail.data_ptr()
        and q_pos.shape == tail.shape
        and q_pos.stride() == tail.stride()
    )


class Rope2D(PositionEncoding):
    """RoPE-ViT: axial (fixed row/column frequencies) or mixed (learned per-head frequencies)."""

    family = "rotary"
    dims = 2
    extrapolates = True
    per_layer = True

    def __init__(
        self,
        *,
        variant: Variant = "axial",
        base: float | None = None,
        heads: int = 8,
        head_dim: int = 64,
        causal: bool = False,
    ) -> None:
        super().__init__(heads=heads, head_dim=head_dim, causal=causal)
        if variant not in PAPER_BASE:
            raise UsageError(f"rope2d: variant must be 'axial' or 'mixed', got {variant!r}")
        if head_dim < 4 or head_dim % 4:
            raise UsageError(
                f"rope2d: head_dim must be a multiple of 4 (pairs for rows and columns), got "
                f"{head_dim}; change the model width or head count"
            )
        base = PAPER_BASE[variant] if base is None else base
        if base <= 1:
            raise UsageError(f"rope2d: base must be > 1, got {base}")
        self.variant: Variant = variant
        self.base = base
        self.row_freqs: nn.Parameter | None = None
        self.col_freqs: nn.Parameter | None = None
        if variant == "mixed":
            row, col = mixed_init(heads, head_dim, base)
            self.row_freqs = nn.Parameter(row.float())  # (H, d/2)
            self.col_freqs = nn.Parameter(col.float())  # (H, d/2)
        # a plain float64 attribute, not a buffer: module.half() must not round the frequencies
        self.freqs = axis_frequencies(head_dim, base)  # (d/4,)

    def extra_repr(self) -> str:
        return f"variant={self.variant}, base={self.base}"

    def angles(self, positions: Tensor) -> Tensor:
        """Rotation angles ``(N, d/2)`` (axial) or ``(H, N, d/2)`` (mixed)."""
        if positions.dim() != 2:
            raise UsageError("rope2d: needs (row, col) grid positions; use rope for sequences")
        if self.row_freqs is None or self.col_freqs is None:
            return axial_angles(positions, self.freqs)
        return mixed_angles(positions, self.row_freqs, self.col_freqs)

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        k_angle = self.angles(k_pos)
        if _queries_are_key_tail(q_pos, k_pos):
            q_angle = k_angle[..., k_pos.shape[0] - q_pos.shape[0] :, :]
        else:
            q_angle = self.angles(q_pos)
        q_cos, q_sin = q_angle.cos().to(q.dtype), q_angle.sin().to(q.dtype)
        k_cos, k_sin = k_angle.cos().to(k.dtype), k_angle.sin().to(k.dtype)
        return (
            rotate_pairs(q, q_cos, q_sin, "interleaved"),
            rotate_pairs(k, k_cos, k_sin, "interleaved"),
        )

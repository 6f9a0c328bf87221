"""Absolute position encodings, added to the token embeddings once at the input.

- ``NoPosition``: nothing at all. Attention is then permutation-equivariant; with a causal mask
  the model can still infer position (Kazemnejad et al. 2023, "NoPE").
- ``Sinusoidal``: Vaswani et al. 2017, "Attention Is All You Need", section 3.5:
  ``PE(pos, 2i) = sin(pos / 10000^(2i/d))``, ``PE(pos, 2i+1) = cos(pos / 10000^(2i/d))``.
  Deviation from the source article: its example loop steps ``i`` by 2 and then uses ``2*i/d``,
  which doubles the exponent; this file uses the paper's formula and a test pins it.
- ``LearnedAbsolute``: a trained table, as BERT and DeiT use. It has no entry past its length,
  so asking for one is a clear error rather than an index error.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc_cli.encodings.base import PositionEncoding
from posenc_cli.errors import UsageError


def sinusoidal_table(length: int, dim: int, base: float = 10000.0) -> Tensor:
    """The Vaswani table, ``(length, dim)``: sin on even columns, cos on odd ones."""
    pos = torch.arange(length, dtype=torch.float64)[:, None]  # (L, 1)
    pair = torch.arange(0, dim, 2, dtype=torch.float64)  # 2i for i = 0 .. ceil(d/2)-1
    angle = pos / base ** (pair / dim)  # (L, ceil(d/2))
    table = torch.zeros(length, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : dim // 2])
    return table.float()


class NoPosition(PositionEncoding):
    """No position information ("NoPE")."""

    family = "none"
    reads_positions = False


class Sinusoidal(PositionEncoding):
    """Fixed sinusoid added to the input; computed for any position, so it runs at any length."""

    family = "absolute"

    def __init__(
        self,
        *,
        dim: int = 512,
        base: float = 10000.0,
        heads: int = 8,
        head_dim: int = 64,
        causal: bool = False,
    ) -> None:
        super().__init__(heads=heads, head_dim=head_dim, causal=causal)
        if dim < 2 or base <= 1:
            raise UsageError(f"sinusoidal: needs dim >= 2 and base > 1, got dim={dim} base={base}")
        self.dim = dim
        self.base = base

    def table(self, positions: Tensor) -> Tensor:
        """Rows of the table at arbitrary (possibly shifted) positions, ``(N, dim)``."""
        pair = torch.arange(0, self.dim, 2, device=positions.device, dtype=torch.float64)
        angle = positions.double()[:, None] / self.base ** (pair / self.dim)
        out = torch.zeros(len(positions), self.dim, dtype=torch.float64, device=positions.device)
        out[:, 0::2] = torch.sin(angle)
        out[:, 1::2] = torch.cos(angle[:, : self.dim // 2])
        return out

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        return x + self.table(positions).to(x.dtype)


class LearnedAbsolute(PositionEncoding):
    """A learned ``(length, dim)`` table (BERT, GPT-2, DeiT)."""

    family = "absolute"
    extrapolates = False

    def __init__(
        self,
        *,
        dim: int = 512,
        length: int = 512,
        heads: int = 8,
        head_dim: int = 64,
        causal: bool = False,
    ) -> None:
        super().__init__(heads=heads, head_dim=head_dim, causal=causal)
        if length < 1:
            raise UsageError(f"learned: length must be >= 1, got {length}")
        self.length = length
        self.table = nn.Parameter(torch.randn(length, dim) * 0.02)  # BERT's init std

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        last = int(positions.max()) if positions.numel() else -1
        if last >= self.length or int(positions.min()) < 0:
            raise UsageError(
                f"learned: position {last} is past the table's length {self.length}; "
                f"set length >= {last + 1} or use an encoding that extrapolates (rope, alibi, t5)"
            )
        return x + self.table[positions]

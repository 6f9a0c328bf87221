"""xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer", ACL 2023): RoPE with an
exponential decay folded into the rotation.

Each rotated pair c of the head carries ``zeta_c = (2c / d + gamma) / (1 + gamma)``; the query at
position i is scaled by ``zeta_c ** (i / B)`` and the key at j by ``zeta_c ** (-j / B)``, so
``q_i . k_j`` carries ``zeta_c ** ((i - j) / B)``: RoPE's relative rotation times a decay with
distance, which is what the paper credits for stable attention past the trained length.

Conventions:
- ``gamma = 0.4`` and the scale base ``B = 512`` are the paper's; frequencies are RoPE's
  (base 10000, interleaved pairs, the whole head rotated).
- Causal only, as published: for a key after its query the factor would grow with distance.
- The exponents are taken about the middle key position (a constant, which cancels in
  ``q . k``) so that long sequences do not overflow; the authors' code centres them as well.
- No parameters; one instance serves every layer.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc_cli.encodings.base import PositionEncoding
from posenc_cli.encodings.rope import rope_frequencies
from posenc_cli.errors import UsageError
from posenc_cli.kernels.rotary import rotary_tables, rotate_pairs


class XPos(PositionEncoding):
    """RoPE whose pair c decays as ``zeta_c ** ((i - j) / B)``."""

    family = "rotary"
    causal_only = True
    per_layer = False

    def __init__(
        self,
        *,
        gamma: float = 0.4,
        scale_base: float = 512.0,
        base: float = 10000.0,
        heads: int = 8,
        head_dim: int = 64,
        causal: bool = False,
    ) -> None:
        super().__init__(heads=heads, head_dim=head_dim, causal=causal)
        if not causal:
            raise UsageError(
                "xpos: defined for causal models only (a key after its query would grow with "
                "distance); use it with a language-model task"
            )
        if head_dim % 2 or gamma <= 0 or scale_base <= 0 or base <= 1:
            raise UsageError(
                f"xpos: needs an even head_dim, gamma > 0, scale_base > 0 and base > 1, got "
                f"head_dim={head_dim}, gamma={gamma}, scale_base={scale_base}, base={base}"
            )
        self.gamma, self.scale_base, self.base = gamma, scale_base, base
        self.inv_freq = rope_frequencies(head_dim, base)  # float64 (d/2,)
        pair = torch.arange(head_dim // 2, dtype=torch.float64)
        self.zeta = (2 * pair / head_dim + gamma) / (1 + gamma)  # float64 (d/2,)

    def extra_repr(self) -> str:
        return f"gamma={self.gamma}, scale_base={self.scale_base}, base={self.base}"

    def tables(self, positions: Tensor, centre: float, sign: float, dtype: torch.dtype):
        """cos and sin of RoPE's angles times ``zeta ** (sign (p - centre) / B)``, ``(N, d/2)``."""
        p = positions.to(torch.float64)[:, None]
        size = self.zeta.to(positions.device) ** (sign * (p - centre) / self.scale_base)
        return rotary_tables(positions, self.inv_freq, dtype, size)

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        centre = float(k_pos.to(torch.float64).mean()) if k_pos.numel() else 0.0
        q_cos, q_sin = self.tables(q_pos, centre, 1.0, q.dtype)
        k_cos, k_sin = self.tables(k_pos, centre, -1.0, k.dtype)
        return (
            rotate_pairs(q, q_cos, q_sin, "interleaved"),
            rotate_pairs(k, k_cos, k_sin, "interleaved"),
        )

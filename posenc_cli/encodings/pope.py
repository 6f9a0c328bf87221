"""PoPE: polar coordinate position embedding (Gopalakrishnan et al. 2025, arXiv 2509.10534,
"Decoupling the 'What' and 'Where' With Polar Coordinate Positional Embeddings").

Every channel c of q and k becomes a complex number whose magnitude is content and whose phase
is position: ``softplus(q_c) e^{i (m theta_c + delta_c)}`` and ``softplus(k_c) e^{i n theta_c}``.
The score is the real part of their product:

    s_mn = sum_c softplus(q_c) softplus(k_c) cos((m - n) theta_c + delta_c)

so what a token is (the magnitudes) and where it is (the phases) no longer mix, which RoPE's
rotation of (q_2c, q_2c+1) pairs does.

Conventions:
- One frequency per channel, ``theta_c = base^(-c/d)`` for ``c = 0 .. d - 1`` (d frequencies,
  where RoPE has d/2), base 10000.
- ``delta`` is learned per head and channel, initialised at 0; per layer.
- Implemented as a rotation hook: ``q' = [a cos(m theta + delta), a sin(m theta + delta)]`` and
  ``k' = [b cos(n theta), b sin(n theta)]`` (a, b the softplus magnitudes) have ``q' . k' = s``,
  so attention runs as usual on width 2d for q and k (SDPA takes a value width that differs).
- The scale on the score stays 1/sqrt(d).
- On the CPU, SDPA's flash kernel wants one head width for q, k and v; with v of width d it took
  the math path, which builds every (N, N) intermediate. On long inputs (``attend``) v is padded
  with zeros to 2d for the flash kernel and the output cut back: one causal layer fwd+bwd at
  N=1024 (B=4, H=8, d=64) went 2.19x -> 1.59x of `none`, bidirectional 1.91x -> 1.65x; at N=256
  the math path was faster (1.40x against 1.49x), so short inputs keep it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc_cli.encodings.base import PositionEncoding
from posenc_cli.errors import UsageError
from posenc_cli.kernels.biased_sdpa import EXPLICIT_MAX_PAIRS


class PolarEmbedding(PositionEncoding):
    """Content magnitudes, positional phases: ``sum_c |q_c| |k_c| cos((m-n) theta_c + delta_c)``."""

    family = "rotary"
    per_layer = True

    def __init__(
        self, *, base: float = 10000.0, heads: int = 8, head_dim: int = 64, causal: bool = False
    ) -> None:
        super().__init__(heads=heads, head_dim=head_dim, causal=causal)
        if base <= 1:
            raise UsageError(f"pope: base must be > 1, got {base}")
        self.base = base
        self.theta = base ** (-torch.arange(head_dim, dtype=torch.float64) / head_dim)  # (d,)
        self.delta = nn.Parameter(torch.zeros(heads, head_dim))

    def extra_repr(self) -> str:
        return f"base={self.base}, heads={self.heads}"

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        theta = self.theta.to(q.device)
        q_angle = (q_pos.to(torch.float64)[:, None] * theta).to(q.dtype)  # (Nq, d)
        k_angle = (k_pos.to(torch.float64)[:, None] * theta).to(k.dtype)  # (Nk, d)
        q_angle = q_angle + self.delta.to(q.dtype)[None, :, None, :]  # (1, H, Nq, d)
        a, b = F.softplus(q), F.softplus(k)
        rq = torch.cat([a * q_angle.cos(), a * q_angle.sin()], dim=-1)  # (B, H, Nq, 2d)
        rk = torch.cat([b * k_angle.cos(), b * k_angle.sin()], dim=-1)  # (B, H, Nk, 2d)
        return rq, rk

    def attend(self, q, k, v, q_pos, k_pos, scale, causal, key_mask=None) -> Tensor | None:
        """Long inputs on the flash kernel, v padded to the width of the rotated q and k; a key
        mask, keys longer than the queries under a causal mask (SDPA aligns ``is_causal`` top
        left) and short inputs take the attention module's paths."""
        long = q.shape[-2] * k.shape[-2] > EXPLICIT_MAX_PAIRS
        square = q.shape[-2] == k.shape[-2]
        if key_mask is not None or not long or (causal and not square):
            return None
        wide = F.pad(v, (0, q.shape[-1] - v.shape[-1]))
        out = F.scaled_dot_product_attention(q, k, wide, is_causal=causal, scale=scale)
        return out[..., : v.shape[-1]]

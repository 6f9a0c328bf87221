"""CoPE: contextual position encoding (Golovneva, Wang, Weston and Sukhbaatar 2024, "Contextual
Position Encoding: Learning to Count What's Important").

Positions are counted in context rather than in tokens. Query i gates every key before it,
``g_ij = sigmoid(q_i . k_j * scale)``, and key j sits at the fractional position
``p_ij = sum_{t=j..i} g_it`` from the query: the number of gated keys between them. The logit
gains ``q_i . e[p_ij]``, with ``e`` a learned table of ``npos_max`` vectors interpolated between
``floor(p)`` and ``ceil(p)``; ``p`` is capped at ``npos_max - 1``.

Conventions:
- Causal only, as published (the count runs from the key up to the query).
- ``q . e[p]`` is never formed as ``(N, N, d)``: ``z_i = q_i . e[k]`` for the integer positions
  is ``(N, npos_max)`` per head, and each pair reads and blends two of its entries, so the extra
  memory is the size of the logits.
- The gate reads the same scaled ``q . k`` as attention (the paper's code gates the logits).
- The table ``e`` is ``(H, npos_max, d)`` with BERT's init (std 0.02), per layer.
- With right padding, as posenc pads, a real query never counts a pad key (it lies after the
  query); left padding would be counted.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc_cli.encodings.base import PositionEncoding
from posenc_cli.errors import UsageError
from posenc_cli.kernels.cope_attention import cope_attention
from posenc_cli.kernels.positions import consecutive


class CoPE(PositionEncoding):
    """Adds ``q_i . e[p_ij]``, ``p_ij`` the gated count of keys from j to i."""

    family = "relative"
    reads_positions = False
    causal_only = True
    per_layer = True

    def __init__(
        self, *, npos_max: int = 64, heads: int = 8, head_dim: int = 64, causal: bool = False
    ) -> None:
        super().__init__(heads=heads, head_dim=head_dim, causal=causal)
        if not causal:
            raise UsageError(
                "cope: defined for causal models only (positions count the keys up to the "
                "query); use it with a language-model task"
            )
        if npos_max < 2:
            raise UsageError(f"cope: npos_max must be >= 2, got {npos_max}")
        self.npos_max = npos_max
        self.table = nn.Parameter(torch.randn(heads, npos_max, head_dim) * 0.02)

    def extra_repr(self) -> str:
        return f"npos_max={self.npos_max}, heads={self.heads}"

    def attend(self, q, k, v, q_pos, k_pos, scale, causal, key_mask=None) -> Tensor | None:
        """The whole causal attention in blocks of query rows, forward and backward by hand
        (``kernels/cope_attention.py``): the scores made once for gate and logit, memory linear
        in N. Over consecutive positions, with every query seeing a real key (the first key
        real, as right padding leaves it); else the attention module's paths."""
        same_scale = scale == self.logit_scale()  # the gates read the logits' own scores
        if not (same_scale and consecutive(k_pos)) or q.dtype not in (torch.float32, torch.float64):
            return None
        if key_mask is not None:
            key_mask = key_mask.bool()
            if not bool(key_mask[:, 0].all()):
                return None
        table = self.table.to(q.dtype)
        return cope_attention(q, k, v, table, scale, key_mask)

    def positions(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """The fractional positions ``p_ij`` ``(B, H, Nq, Nk)``, capped (0 for later keys)."""
        gates = torch.sigmoid(q @ k.transpose(-2, -1) * self.logit_scale())
        if consecutive(k_pos):
            # with C the running sum over keys, p_ij = C_ii - C_ij + g_ij: no mask and no
            # flips (each a pass over the logits). Later keys come out <= 0, clamped to 0.
            running = gates.cumsum(-1)
            own = running.diagonal(k.shape[-2] - q.shape[-2], -2, -1)  # C_ii, the query's key
            counted = own[..., None] - running + gates
        else:
            allowed = k_pos[None, :] <= q_pos[:, None]  # (Nq, Nk)
            # sum over t = j .. i: a cumulative sum from the right
            counted = (gates * allowed).flip(-1).cumsum(-1).flip(-1)
        return counted.clamp(0, self.npos_max - 1)

    def bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        p = self.positions(q, k, q_pos, k_pos)
        z = q @ self.table.to(q.dtype).transpose(-2, -1)  # (B, H, Nq, npos_max)
        step = F.pad(z.diff(dim=-1), (0, 1))  # z[p + 1] - z[p]; 0 at the cap, where frac is 0
        low = p.floor()
        index = low.long()
        # e[p] blended between floor(p) and floor(p) + 1, both read with one index tensor
        return torch.gather(z, -1, index) + (p - low) * torch.gather(step, -1, index)

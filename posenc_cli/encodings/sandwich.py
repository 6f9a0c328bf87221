"""Sandwich (Chi, Fan, Rudnicky and Ramadge 2023, "Dissecting Transformer Length Extrapolation
via the Lens of Receptive Field Analysis", ACL 2023): the inner product of two sinusoidal
position embeddings, used as a bias instead of being added to the inputs.

``p_i . p_j = sum_{k=1..d'/2} cos((i - j) / 10000^(2k / d'))`` depends on ``i - j`` only and falls,
on average, with distance, which is the decay ALiBi hand-codes.

Conventions:
- ``width`` is the paper's ``d'``, the width of the sinusoids; by default the model's width, as
  in the authors' implementation.
- The bias is shifted by ``-d'/2`` so that it is 0 at distance 0 (the largest value it takes),
  and head ``h`` (1-based, of ``H``) divides it by ``8h / H``, ALiBi's spread of head scales as
  in the authors' implementation: early heads see a sharper decay than late ones.
- Nothing is learned; one instance serves all layers. The bias depends on positions only
  (``(1, H, Nq, Nk)``) and runs on SDPA's fused path.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc_cli.encodings.base import PositionEncoding, relative_positions
from posenc_cli.errors import UsageError


class Sandwich(PositionEncoding):
    """``(sum_k cos((i - j) / 10000^(2k/d')) - d'/2) / (8h / H)`` per head ``h``."""

    content_free = True  # the bias reads positions only
    toeplitz = True  # ... and depends on j - i alone
    family = "bias"
    per_layer = False

    def __init__(
        self,
        *,
        width: int | None = None,
        dim: int = 512,
        heads: int = 8,
        head_dim: int = 64,
        causal: bool = False,
    ) -> None:
        super().__init__(heads=heads, head_dim=head_dim, causal=causal)
        width = dim if width is None else width
        if width < 2 or width % 2:
            raise UsageError(f"sandwich: width (the paper's d') must be even and >= 2, got {width}")
        self.width = width

    def extra_repr(self) -> str:
        return f"d'={self.width}, heads={self.heads}"

    def bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        dtype = torch.promote_types(q.dtype, torch.float32)
        half = self.width // 2
        ks = torch.arange(1, half + 1, dtype=torch.float64, device=q.device)
        inv_freq = (10000.0 ** (-2.0 * ks / self.width)).to(dtype)  # (d'/2,)
        distance = relative_positions(q_pos, k_pos)  # (Nq, Nk)
        # the sum depends on i - j alone: take it once per distance, then gather
        low = int(distance.min())
        values = torch.arange(low, int(distance.max()) + 1, device=q.device).to(dtype)
        per_distance = torch.cos(values[:, None] * inv_freq).sum(-1)  # (distinct distances,)
        total = per_distance[distance - low]  # (Nq, Nk)
        heads = torch.arange(1, self.heads + 1, dtype=dtype, device=q.device)
        scale = (8.0 * heads / self.heads).view(-1, 1, 1)  # (H, 1, 1)
        return ((total - half) / scale).unsqueeze(0)  # (1, H, Nq, Nk)

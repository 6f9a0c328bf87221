"""KERPLE: kernelized relative positional embedding (Chi, Fan, Ramadge and Rudnicky 2022,
"KERPLE: Kernelized Relative Positional Embedding for Length Extrapolation", NeurIPS 2022).

Each head adds a conditionally positive definite kernel of the distance to its logits:

- ``log``   (the form that extrapolated best in the paper): ``-r1 * log(1 + r2 * |i - j|)``;
- ``power``: ``-r1 * |i - j| ** r2``, with ``0 < r2 <= 2`` (the kernel is CPD only there).

Conventions:
- ``r1`` and ``r2`` are learned per head and per layer. Initialised as the authors' code does:
  ``r1`` uniform in (0, 2), ``r2`` uniform in (0, 1) for ``log``, (0, 2) for ``power``.
- Positivity: the authors clamp the parameters' data at 0.01 before each forward. Here the
  forward reads ``clamp(r, min=0.01)`` (and ``max=2`` for the power's exponent), which gives the
  same values without editing parameters in place; below the floor the gradient is 0 in both.
- The bias is symmetric in ``i - j`` so it serves bidirectional models too; under a causal mask
  it equals the paper's causal form. It depends on positions only: ``(1, H, Nq, Nk)``, shared
  by the batch, on SDPA's fused path.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from posenc_cli.encodings.base import PositionEncoding, relative_positions
from posenc_cli.errors import UsageError

FLOOR = 1e-2  # the authors' eps
Kernel = Literal["log", "power"]


class Kerple(PositionEncoding):
    """``-r1 log(1 + r2 |i - j|)`` or ``-r1 |i - j|^r2`` per head, both learned."""

    content_free = True  # the bias reads positions only
    toeplitz = True  # ... and depends on j - i alone
    family = "bias"
    per_layer = True

    def __init__(
        self,
        *,
        kernel: Kernel = "log",
        heads: int = 8,
        head_dim: int = 64,
        causal: bool = False,
    ) -> None:
        super().__init__(heads=heads, head_dim=head_dim, causal=causal)
        if kernel not in ("log", "power"):
            raise UsageError(f"kerple: kernel must be 'log' or 'power', got {kernel!r}")
        self.kernel = kernel
        self.r1 = nn.Parameter(torch.rand(heads) * 2)
        self.r2 = nn.Parameter(torch.rand(heads) * (1 if kernel == "log" else 2))

    def extra_repr(self) -> str:
        return f"kernel={self.kernel}, heads={self.heads}"

    def bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        dtype = torch.promote_types(q.dtype, torch.float32)
        distance = relative_positions(q_pos, k_pos).abs().to(dtype)  # (Nq, Nk)
        r1 = self.r1.to(dtype).clamp(min=FLOOR).view(-1, 1, 1)  # (H, 1, 1)
        if self.kernel == "log":
            r2 = self.r2.to(dtype).clamp(min=FLOOR).view(-1, 1, 1)
            return (-r1 * torch.log1p(r2 * distance)).unsqueeze(0)  # (1, H, Nq, Nk)
        r2 = self.r2.to(dtype).clamp(min=FLOOR, max=2.0).view(-1, 1, 1)
        # |d|^r2 with d = 0 gives 0 and a finite gradient for r2 (0^r2 log 0 is masked)
        powered = torch.where(distance > 0, distance.clamp(min=1).pow(r2), 0.0)
        return (-r1 * powered).unsqueeze(0)

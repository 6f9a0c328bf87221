"""ALiBi: attention with linear biases, no position embedding at all.

Press, Smith and Lewis 2022, "Train Short, Test Long: Attention with Linear Biases Enables Input
Length Extrapolation" (ICLR 2022): each head adds ``-slope_h * distance`` to its logits.

Conventions (DESIGN.md section 3):

- Slopes follow the paper's recipe and reference code: for a power-of-two head count ``n``, the
  geometric sequence ``2^(-8/n), 2^(-16/n), ..., 2^(-8)``; otherwise the sequence of the largest
  power of two ``p < n``, followed by every other slope of the ``2p`` sequence (its 1st, 3rd, ...)
  for the remaining ``n - p`` heads. Libraries that use ``2^(-8(h+1)/n)`` for every ``n`` differ
  from this for non-powers of two.
- The bias is the symmetric ``-slope_h * |i - j|`` ``(1, H, Nq, Nk)``, so it also serves
  bidirectional models. In a causal model the mask removes ``j > i``, and what is left equals the
  paper's causal form ``-slope_h * (i - j)``. (The reference code adds ``slope_h * j`` instead,
  which differs from ``-slope_h * (i - j)`` by a constant per query row, and softmax ignores it.)
- The scale on q.k stays the default 1/sqrt(d); the bias is added unscaled, in logit units.
- On long inputs over consecutive positions the CPU flash kernel reads the bias as a view of its
  value per distance (``kernels/blocked_bias.py``): no ``(N, N)`` bias, memory linear in N.
- No learned parameters; one instance serves all layers. Slopes are computed in float64 and the
  bias in float32 (float64 when q is float64), then cast to q's dtype by the attention module, so
  half-precision models do not round the slopes.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from posenc_cli.encodings.base import PositionEncoding, relative_positions
from posenc_cli.errors import UsageError


def geometric_slopes(num_heads: int) -> list[float]:
    """The power-of-two recipe: ``2^(-8 (h + 1) / n)`` for ``h = 0 .. n - 1``."""
    return [2.0 ** (-8.0 * (h + 1) / num_heads) for h in range(num_heads)]


def slopes(num_heads: int) -> list[float]:
    """ALiBi slope of each head, by the paper's recipe (see the module docstring)."""
    if num_heads < 1:
        raise UsageError(f"alibi: heads must be >= 1, got {num_heads}")
    lower = 2 ** int(math.log2(num_heads))  # largest power of two <= num_heads
    if lower == num_heads:
        return geometric_slopes(num_heads)
    return geometric_slopes(lower) + geometric_slopes(2 * lower)[0::2][: num_heads - lower]


class ALiBi(PositionEncoding):
    """Adds ``-slope_h * |i - j|`` to head h's logits; nothing learned, shared by all layers."""

    content_free = True  # the bias reads positions only
    toeplitz = True  # ... and depends on j - i alone
    family = "bias"
    per_layer = False

    def __init__(self, *, heads: int = 8, head_dim: int = 64, causal: bool = False) -> None:
        super().__init__(heads=heads, head_dim=head_dim, causal=causal)
        self.slopes = slopes(heads)
        # Plain tensors per (device, dtype), not a buffer: ``.half()`` on the model would round
        # a buffer's slopes, and there is nothing to save in a checkpoint.
        self._slope_cache: dict[tuple[torch.device, torch.dtype], Tensor] = {}

    def extra_repr(self) -> str:
        return f"heads={self.heads}"

    def slope_tensor(self, device: torch.device, dtype: torch.dtype) -> Tensor:
        """The slopes as ``(H, 1, 1)`` on ``device`` in ``dtype``, built once per pair."""
        key = (device, dtype)
        if key not in self._slope_cache:
            values = torch.tensor(self.slopes, dtype=torch.float64)
            self._slope_cache[key] = values.to(device=device, dtype=dtype).view(-1, 1, 1)
        return self._slope_cache[key]

    def bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        dtype = torch.promote_types(q.dtype, torch.float32)
        distance = relative_positions(q_pos, k_pos).abs().to(dtype)  # (Nq, Nk)
        return (-self.slope_tensor(q.device, dtype) * distance).unsqueeze(0)  # (1, H, Nq, Nk)

"""FIRE: functional interpolation for relative positions (Li et al. 2023, "Functional
Interpolation for Relative Positions Improves Long Context Transformers", ICLR 2024).

The bias of query i and key j is a small learned function of their progressive distance:

    b(i, j) = f_theta( psi(i - j) / psi(max(L, i)) ),   psi(x) = log(c x + 1)

``f_theta`` maps one number to one bias per head (an MLP: 1 -> ``hidden`` -> heads, ReLU), and
``c`` and the threshold ``L`` are learned. Dividing by ``psi(max(L, i))`` maps every distance a
query can see into [0, 1], whatever the length: what the paper credits for extrapolation.
With suitable ``f_theta`` it represents T5's buckets, ALiBi and KERPLE.

Conventions:
- Causal models use ``i - j`` (>= 0 wherever the mask lets a key through); bidirectional ones
  use ``|i - j|``, so keys on either side at one distance share a bias (the paper's
  experiments are causal).
- Initial values: ``c = 0.1``, ``L = 512``, ``hidden = 32``; all three are parameters here.
  ``c`` is read as ``clamp(c, min=1e-6)`` so ``psi`` stays defined, and ``L`` as at least 1.
- Cost: while every query position is at most ``L``, all rows share one normaliser and the bias
  depends on the distance alone; ``f_theta`` then runs once per distinct distance and the
  result is gathered into ``(1, H, Nq, Nk)``. Past ``L`` each row has its own normaliser and
  ``f_theta`` runs on every pair. A ReLU MLP of one input is piecewise linear, with a knee
  where each hidden unit turns on, and a block's inputs span a short range that holds few of
  the knees: the units without one there are a single line per head, so ``piecewise`` runs the
  block through an MLP of the bending units and that line only, one matmul, where the full MLP
  would hold a ``(Nq, Nk, hidden)`` intermediate twice. Values and gradients are the MLP's.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc_cli.encodings.base import PositionEncoding, relative_positions
from posenc_cli.errors import UsageError


def per_pair(table: Tensor, index: Tensor) -> Tensor:
    """``table[index]`` with the heads first, ``(n, H)`` by ``(...)`` ids -> ``(H, ...)``. One
    ``index_select`` of the flat ids, whose backward is an index_add: indexing with the ids
    tensor itself measured 6x slower forward and backward (its backward an accumulating
    ``index_put``; 256 x 256 pairs, 8 heads, 33 pieces: 2.6 ms against 0.4 ms)."""
    return table.T.index_select(1, index.flatten()).view(-1, *index.shape)


class Fire(PositionEncoding):
    """A learned function of ``psi(i - j) / psi(max(L, i))`` per head."""

    content_free = True  # the bias reads positions only
    family = "bias"
    per_layer = True

    def __init__(
        self,
        *,
        hidden: int = 32,
        c: float = 0.1,
        threshold: float = 512.0,
        heads: int = 8,
        head_dim: int = 64,
        causal: bool = False,
    ) -> None:
        super().__init__(heads=heads, head_dim=head_dim, causal=causal)
        if hidden < 1 or c <= 0 or threshold < 1:
            raise UsageError(
                f"fire: needs hidden >= 1, c > 0 and threshold >= 1, got hidden={hidden}, "
                f"c={c}, threshold={threshold}"
            )
        self.mlp = nn.Sequential(nn.Linear(1, hidden), nn.ReLU(), nn.Linear(hidden, heads))
        self.c = nn.Parameter(torch.tensor(float(c)))
        self.threshold = nn.Parameter(torch.tensor(float(threshold)))

    def extra_repr(self) -> str:
        return f"heads={self.heads}, causal={self.causal}"

    def psi(self, x: Tensor) -> Tensor:
        return torch.log1p(self.c.to(x.dtype).clamp(min=1e-6) * x)

    def bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        dtype = self.mlp[0].weight.dtype  # f_theta runs in its own precision
        distance = relative_positions(q_pos, k_pos).neg()  # i - j, (Nq, Nk)
        distance = distance.clamp(min=0) if self.causal else distance.abs()
        threshold = self.threshold.to(dtype).clamp(min=1.0)
        rows = q_pos.to(dtype)
        if bool((rows <= threshold).all()):  # one normaliser: a function of the distance
            distinct = torch.arange(int(distance.max()) + 1, device=q.device).to(dtype)
            per_distance = self.mlp((self.psi(distinct) / self.psi(threshold))[:, None])  # (D, H)
            return per_pair(per_distance, distance).unsqueeze(0)  # (1, H, Nq, Nk)
        scale = self.psi(torch.maximum(rows, threshold))[:, None]  # (Nq, 1)
        ratio = self.psi(distance.to(dtype)) / scale  # (Nq, Nk)
        return self.piecewise(ratio).unsqueeze(0)

    def piecewise(self, x: Tensor) -> Tensor:
        """``f_theta(x)`` for every entry of ``x``, ``(H, *x.shape)``. Over the range ``x`` spans,
        a unit whose input does not change sign is a straight line (on) or zero (off): those
        fold into one line per head, and only the units that bend inside the range stay ReLUs.
        So ``f_theta`` is a narrower MLP there, run as one matmul over the inputs, whose hidden
        rows are the bending units and the line. Values and gradients are the MLP's."""
        first, second = self.mlp[0], self.mlp[2]
        w, b = first.weight[:, 0], first.bias  # (hidden,)
        flat = x.reshape(1, -1)
        lo, hi = (float(t) for t in torch.aminmax(flat.detach()))
        with torch.no_grad():  # which units bend, which are straight and on
            bends = (w * lo + b) * (w * hi + b) < 0
            on = (w * (lo + hi) / 2 + b > 0) & ~bends
        straight = second.weight[:, on]  # (H, units on throughout)
        slope = straight @ w[on]  # (H,)
        intercept = straight @ b[on] + second.bias
        # the line's own row reads x - lo + 1 (always positive, so its ReLU passes it through)
        rows_w = torch.cat([w[bends], w.new_ones(1)])
        rows_b = torch.cat([b[bends], w.new_full((1,), 1.0 - lo)])
        hidden = torch.addcmul(rows_b[:, None], rows_w[:, None], flat).relu_()  # (U + 1, n)
        weights = torch.cat([second.weight[:, bends], slope[:, None]], dim=1)  # (H, U + 1)
        offset = intercept + slope * (lo - 1.0)
        return torch.addmm(offset[:, None], weights, hidden).view(-1, *x.shape)

    def score_mod(self, q: Tensor, q_pos: Tensor, k_pos: Tensor):
        """The same function, one pair at a time, for FlexAttention: the MLP's hidden units are
        summed one by one (a scalar input per pair, so no (pair, hidden) tensor)."""
        first, second = self.mlp[0], self.mlp[2]
        w_in, b_in = first.weight[:, 0], first.bias  # (hidden,)
        w_out, b_out = second.weight, second.bias  # (heads, hidden), (heads,)
        threshold = self.threshold.clamp(min=1.0)
        causal = self.causal

        def mod(score, b, h, q_idx, kv_idx):
            i, j = q_pos[q_idx].to(w_in.dtype), k_pos[kv_idx].to(w_in.dtype)
            distance = (i - j).clamp(min=0) if causal else (i - j).abs()
            ratio = self.psi(distance) / self.psi(torch.maximum(i, threshold))
            total = b_out[h]
            for unit in range(len(w_in)):
                total = total + w_out[h, unit] * torch.relu(w_in[unit] * ratio + b_in[unit])
            return score + total.to(score.dtype)

        return mod

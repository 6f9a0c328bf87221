"""Soft, interpolated bucket assignment: the piecewise indices of T5 and iRPE as continuous
functions of their breakpoints, so that gradients reach the breakpoints.

The source article's adaptive direction (``000_*.txt`` section 5): let the encoding choose its
buckets. A bucketed encoding reads ``table[b(x)]`` with an integer ``b``, which has no gradient
in its breakpoints. Here the index is a real number ``u(x)``, continuous in ``x`` and in the
breakpoints, and an entry is read between its two neighbouring buckets:

    read(table, u) = (1 - w) table[floor(u)] + w table[floor(u) + 1],   w = u - floor(u)

- T5 (Raffel et al. 2020, section 2.1): ``u(d) = d`` below ``max_exact``, else
  ``max_exact + log(d / max_exact) / log(max_distance / max_exact) * (n - max_exact)``, capped at
  ``n - 1`` (``n`` buckets per side). ``floor(u)`` is T5's bucket when the breakpoints are
  integers.
- iRPE (Wu et al. 2021, Eq. 18): ``u(x) = x`` for ``|x| <= alpha``, else ``sign(x) min(alpha +
  ln(|x| / alpha) / ln(gamma / alpha) (beta - alpha), int(beta))``. ``round(u)`` is Eq. 18's
  index as ``irpe_index.piecewise_index`` computes it.

Both are the identity on the exact band, where ``u`` is an integer and the read is exactly one
table entry; the interpolation only blends neighbours on the logarithmic band. Breakpoints may
be Python floats or tensors (learned, or one per query when the range is rescaled) that
broadcast against the input.
"""

from __future__ import annotations

import torch
from torch import Tensor


def t5_index(distance: Tensor, max_exact, max_distance, per_side: int) -> Tensor:
    """T5's continuous bucket ``u(d)`` within one side, for distances ``d >= 0`` (floating)."""
    me = torch.as_tensor(max_exact, dtype=distance.dtype, device=distance.device)
    md = torch.as_tensor(max_distance, dtype=distance.dtype, device=distance.device)
    far = torch.maximum(distance, me)  # the logarithm never sees d < max_exact, nor 0
    logged = me + torch.log(far / me) / torch.log(md / me) * (per_side - me)
    return torch.where(distance < me, distance, logged).clamp(max=per_side - 1)


def piecewise_index(x: Tensor, alpha, beta, gamma) -> Tensor:
    """iRPE's continuous index ``u(x)`` (odd in ``x``, ``|u| <= int(beta)``), floating ``x``."""
    a = torch.as_tensor(alpha, dtype=x.dtype, device=x.device)
    g = torch.as_tensor(gamma, dtype=x.dtype, device=x.device)
    magnitude = x.abs()
    far = torch.maximum(magnitude, a)  # the exact band takes the other branch
    logged = a + torch.log(far / a) / torch.log(g / a) * (beta - a)
    capped = torch.where(magnitude <= a, magnitude, logged).clamp(max=int(beta))
    return torch.sign(x) * capped


def neighbours(u: Tensor, top: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(lo, hi, w)`` for an index ``u`` in ``[0, top]``: read ``(1 - w)`` of bucket ``lo``
    and ``w`` of bucket ``hi = min(lo + 1, top)``. ``lo`` is a floor (no gradient); ``w``
    carries the gradient of ``u``."""
    floor = u.detach().floor().clamp(0, top)
    lo = floor.long()
    return lo, (lo + 1).clamp(max=top), u - floor


def read(values: Tensor, u: Tensor, top: int) -> Tensor:
    """``values[..., u]`` interpolated along the last axis (``top + 1`` entries)."""
    lo, hi, w = neighbours(u, top)
    return values[..., lo] * (1 - w) + values[..., hi] * w


__all__ = ["neighbours", "piecewise_index", "read", "t5_index"]

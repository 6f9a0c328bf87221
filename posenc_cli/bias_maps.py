"""The positional part of attention logits, as N x N maps per head, for any encoding.

Every position holds the same (seeded, random) content vector, so whatever varies across the map
comes from position alone. How the map is read depends on the encoding's hook:

- ``bias``: the additive logit term itself (for content-dependent ones, with that content).
- ``rotate``: q.k after rotation, scaled; with equal content everywhere it varies only by position.
- ``embed``: the source article's first claim, side by side: ``U_i . U_j`` (relative: depends
  only on i - j) and ``U_i^T W_q^T W_k U_j`` with random projections (the pattern vanishes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from posenc_cli.encodings import PositionEncoding


@dataclass
class BiasMap:
    title: str
    maps: Tensor  # (H, N, N); H = 1 for maps that do not depend on the head


def toeplitz_error(m: Tensor) -> float:
    """How far a (N, N) map is from depending only on j - i: the largest spread along a
    diagonal, relative to the map's overall spread (0 = purely relative)."""
    n = m.shape[-1]
    spread = float(m.max() - m.min()) or 1.0
    worst = 0.0
    for offset in range(-n + 1, n):
        diag = torch.diagonal(m, offset)
        worst = max(worst, float(diag.max() - diag.min()))
    return worst / spread


@torch.no_grad()
def positional_logits(encoding: PositionEncoding, length: int, seed: int = 0) -> list[BiasMap]:
    """Maps of the positional part of the logits for ``length`` tokens."""
    gen = torch.Generator().manual_seed(seed)
    H, d = encoding.heads, encoding.head_dim
    pos = torch.arange(length)
    content_q = torch.randn(1, H, 1, d, generator=gen).expand(1, H, length, d)
    content_k = torch.randn(1, H, 1, d, generator=gen).expand(1, H, length, d)
    scale = encoding.logit_scale()

    if encoding.family == "absolute":
        dim = H * d
        u = encoding.embed(torch.zeros(1, length, dim), pos)[0]  # (N, D)
        w_q = torch.randn(H, dim, d, generator=gen) / dim**0.5
        w_k = torch.randn(H, dim, d, generator=gen) / dim**0.5
        projected = torch.einsum("nD,hDd,hEd,mE->hnm", u, w_q, w_k, u) * scale  # (H, N, N)
        return [
            BiasMap("U_i . U_j", (u @ u.T)[None] / dim**0.5),
            BiasMap("U_i^T W_q^T W_k U_j (random W)", projected),
        ]
    if encoding.family == "rotary":
        q, k = encoding.rotate(content_q.clone(), content_k.clone(), pos, pos)
        return [BiasMap("q_m . k_n after rotation", (q @ k.transpose(-2, -1))[0] * scale)]
    bias = encoding.bias(content_q.clone(), content_k.clone(), pos, pos)
    if bias is None:
        return [BiasMap("no positional logit term", torch.zeros(1, length, length))]
    return [BiasMap("positional logit term", bias[0].expand(H, length, length))]

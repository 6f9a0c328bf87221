"""iRPE index functions: which learned bucket each (query, key) pair of an image grid reads.

Wu, Peng, Chen, Fu, Chao 2021, "Rethinking and Improving Relative Position Encoding for Vision
Transformer" (ICCV), section 3.3 (piecewise index function, Eq. 18) and section 3.4 (the four
2D methods). Pure functions only: the learned tables and the attention terms live elsewhere.
Every convention below was checked against the official code, microsoft/Cream
``iRPE/DeiT-with-iRPE/irpe.py`` (``piecewise_index``, ``_rp_2d_*``, ``get_num_buckets``,
``get_bucket_ids_2d``, ``get_single_rpe_config``), and the outputs match it id for id.

Conventions:

- Tokens are the ``P`` prefix tokens (class, distillation) first, then the ``H x W`` grid in
  row-major order. The 2D offset of a pair is query position - key position, ``(dr, dc)``.
- Piecewise index ``g(x) = round(x)`` for ``|x| <= alpha`` (the boundary takes this exact
  branch), else ``sign(x) * min(round(alpha + ln(|x|/alpha) / ln(gamma/alpha) * (beta - alpha)),
  beta)``. Rounding is ``torch.round`` (half to even) on the magnitude. The cap: the official
  code clips at the float ``beta`` and then casts to long, which truncates toward zero, so the
  cap is ``B = int(beta)`` (3 at the default beta 3.8; DESIGN.md's ``min(., beta)`` read
  literally would give 3.8). ``g`` is odd and ``|g| <= B`` on integer inputs. The boundary
  ``|x| == alpha`` matters only if ``round(alpha) > beta`` (e.g. alpha = beta = 2.6: g(2.6) = 3
  but g(2.7) = 2), since there the log branch gives ``alpha`` too.
- Arithmetic dtype as in the official code: a floating input keeps its dtype, an integer input
  is promoted to the default dtype (float32). On integers this agrees with float64 (checked for
  ``|x| <= 200000`` at ratios 0.5 to 32); the euclidean float32 ``round(sqrt(.))`` is exact for
  squared distances below 2,363,906, i.e. grids up to 1087 on a side.
- Defaults: ``alpha = ratio``, ``beta = 2 ratio``, ``gamma = 8 ratio``, ``ratio = 1.9``.
- Methods, with ``B = int(beta)``:
  ``euclidean``: ``g(round(sqrt(dr^2 + dc^2))) + B`` (the distance is rounded first, in float32);
  ``quant``: ``g(dr^2 + dc^2) + B``;
  ``cross``: two maps, ``g(dr) + B`` for rows and ``g(dc) + B`` for columns, each indexing its
  own table; the attention term is the sum of the two lookups;
  ``product``: ``(g(dr) + B) * (2B + 1) + (g(dc) + B)``.
- Bucket counts do not depend on the grid: ``(2B + 1)^2`` for product, ``2B + 1`` otherwise
  (per map for cross). As in the official code, euclidean and quant are shifted by ``+B`` too
  although their ``g`` is never negative: their ids lie in ``[B, 2B]`` and buckets ``0 .. B-1``
  are allocated but never read. Kept, so that parameter counts and checkpoints match.
- Prefix tokens: every pair with a prefix token on either side (prefix-prefix included) reads one
  extra bucket, id = the grid count; the returned count includes it. For cross each map gets its
  own extra bucket. Same as the official ``skip`` handling, where ``skip = L - H*W``.

Deviation from the paper (the official code is followed): the paper's quantization method maps
the sorted distinct Euclidean distances ``{0, 1, 1.41, 2, 2.24, ...}`` to ``{0, 1, 2, 3, 4, ...}``
before ``g``; the official ``_rp_2d_quant`` applies ``g`` to the squared distance instead (its
``quantize_values`` helper is never called). So offset (0, 2) reads ``g(4)``, not ``g(3)``.

Efficiency: ids depend only on the offset, so ``g`` runs once per offset on a
``(2H-1, 2W-1)`` table and the ``(HW, HW)`` map is a gather from it.
"""

from __future__ import annotations

import math
from typing import Literal, overload

import torch
from torch import Tensor

from posenc_cli.errors import UsageError

Method = Literal["euclidean", "quant", "cross", "product"]
METHODS: tuple[Method, ...] = ("euclidean", "quant", "cross", "product")
DEFAULT_RATIO = 1.9  # official get_rpe_config default


def params_from_ratio(ratio: float = DEFAULT_RATIO) -> tuple[float, float, float]:
    """The official ``alpha : beta : gamma = 1 : 2 : 8`` shorthand."""
    if not (math.isfinite(ratio) and ratio > 0):
        raise UsageError(f"irpe: ratio must be a positive number, got {ratio}; the default is 1.9")
    return 1 * ratio, 2 * ratio, 8 * ratio


def check_params(alpha: float, beta: float, gamma: float) -> None:
    """UsageError naming the bad key unless ``0 < alpha <= beta`` and ``gamma > alpha``."""
    for key, value in (("alpha", alpha), ("beta", beta), ("gamma", gamma)):
        if not math.isfinite(value):
            raise UsageError(f"irpe: {key} must be a finite number, got {value}")
    if alpha <= 0:
        raise UsageError(f"irpe: alpha ({alpha}) must be > 0; the default is ratio = 1.9")
    if alpha > beta:
        raise UsageError(
            f"irpe: alpha ({alpha}) must not exceed beta ({beta}); "
            f"lower alpha or raise beta (defaults: alpha = ratio, beta = 2 ratio)"
        )
    if gamma <= alpha:
        raise UsageError(
            f"irpe: gamma ({gamma}) must be greater than alpha ({alpha}); "
            f"raise gamma (default: gamma = 8 ratio)"
        )


def piecewise_index(x: Tensor, alpha: float, beta: float, gamma: float) -> Tensor:
    """Eq. 18 of the paper, elementwise: same shape as ``x``, int64, in ``[-int(beta), int(beta)]``
    for integer inputs. ``x`` may be an integer or a floating tensor."""
    check_params(alpha, beta, gamma)
    work = x if x.is_floating_point() else x.to(torch.get_default_dtype())
    magnitude = work.abs()
    exact = magnitude <= alpha
    # Entries of the exact band get a harmless stand-in so the logarithm never sees 0.
    far = torch.where(exact, torch.full_like(magnitude, alpha), magnitude)
    logged = alpha + torch.log(far / alpha) / math.log(gamma / alpha) * (beta - alpha)
    capped = logged.round().clamp(max=beta)  # may be the float beta itself, e.g. 3.8
    log_branch = (torch.sign(work) * capped).long()  # .long() truncates: 3.8 -> 3, -3.8 -> -3
    exact_branch = work.round().long()
    return torch.where(exact, exact_branch, log_branch)


def num_buckets(method: Method, beta: float, prefix_tokens: int = 0) -> int:
    """Buckets of one table (one per map for cross); independent of the grid size."""
    _check_method(method)
    side = 2 * int(beta) + 1
    count = side * side if method == "product" else side
    return count + (1 if prefix_tokens > 0 else 0)


@overload
def bucket_table(
    method: Literal["euclidean", "quant", "product"],
    height: int,
    width: int,
    alpha: float,
    beta: float,
    gamma: float,
) -> Tensor: ...


@overload
def bucket_table(
    method: Literal["cross"], height: int, width: int, alpha: float, beta: float, gamma: float
) -> tuple[Tensor, Tensor]: ...


def bucket_table(
    method: Method, height: int, width: int, alpha: float, beta: float, gamma: float
) -> Tensor | tuple[Tensor, Tensor]:
    """Bucket id per offset, ``(2H-1, 2W-1)``: entry ``[dr + H-1, dc + W-1]`` is the id of offset
    ``(dr, dc)``. For cross, a ``(rows, cols)`` pair of such tables."""
    _check_method(method)
    _check_grid(height, width, 0)
    check_params(alpha, beta, gamma)
    B = int(beta)
    dr = torch.arange(-(height - 1), height)[:, None].expand(2 * height - 1, 2 * width - 1)
    dc = torch.arange(-(width - 1), width)[None, :].expand(2 * height - 1, 2 * width - 1)

    def g(x: Tensor) -> Tensor:
        return piecewise_index(x, alpha, beta, gamma)

    squared = dr * dr + dc * dc  # (2H-1, 2W-1), int64
    if method == "euclidean":
        return g(squared.float().sqrt().round()) + B  # float32 like the official code
    if method == "quant":
        return g(squared) + B
    if method == "cross":
        return g(dr) + B, g(dc) + B
    return (g(dr) + B) * (2 * B + 1) + (g(dc) + B)  # product


@overload
def bucket_ids(
    method: Literal["euclidean", "quant", "product"],
    height: int,
    width: int,
    alpha: float,
    beta: float,
    gamma: float,
    prefix_tokens: int = 0,
) -> tuple[Tensor, int]: ...


@overload
def bucket_ids(
    method: Literal["cross"],
    height: int,
    width: int,
    alpha: float,
    beta: float,
    gamma: float,
    prefix_tokens: int = 0,
) -> tuple[tuple[Tensor, Tensor], int]: ...


def bucket_ids(
    method: Method,
    height: int,
    width: int,
    alpha: float,
    beta: float,
    gamma: float,
    prefix_tokens: int = 0,
) -> tuple[Tensor | tuple[Tensor, Tensor], int]:
    """Bucket id of every (query, key) token pair and the number of buckets.

    Returns ``(ids, count)``: ``ids`` is an int64 ``(P + HW, P + HW)`` tensor (queries along
    dim 0, keys along dim 1) with values in ``[0, count)``; for ``cross`` it is a
    ``(row_ids, col_ids)`` tuple of two such tensors, and ``count`` is the size of each of the two
    tables. ``count`` includes the shared prefix bucket when ``prefix_tokens > 0``.
    """
    _check_method(method)
    _check_grid(height, width, prefix_tokens)
    tables = bucket_table(method, height, width, alpha, beta, gamma)
    tables = tables if isinstance(tables, tuple) else (tables,)

    rows = torch.arange(height).repeat_interleave(width)  # (HW,) row-major
    cols = torch.arange(width).repeat(height)  # (HW,)
    dr = rows[:, None] - rows[None, :] + (height - 1)  # (HW, HW), query - key, shifted to >= 0
    dc = cols[:, None] - cols[None, :] + (width - 1)  # (HW, HW)
    count = num_buckets(method, beta)
    maps = []
    for table in tables:
        grid = table[dr, dc]  # (HW, HW)
        if prefix_tokens > 0:
            n = prefix_tokens + height * width
            full = torch.full((n, n), count, dtype=torch.long)  # (P+HW, P+HW), prefix bucket
            full[prefix_tokens:, prefix_tokens:] = grid
            grid = full
        maps.append(grid)
    total = num_buckets(method, beta, prefix_tokens)
    if method == "cross":
        return (maps[0], maps[1]), total
    return maps[0], total


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise UsageError(f"irpe: method must be one of {', '.join(METHODS)}, got {method!r}")


def _check_grid(height: int, width: int, prefix_tokens: int) -> None:
    if height < 1 or width < 1:
        raise UsageError(f"irpe: height and width must be >= 1, got {height} x {width}")
    if prefix_tokens < 0:
        raise UsageError(f"irpe: prefix_tokens must be >= 0, got {prefix_tokens}")

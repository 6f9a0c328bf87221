"""``auto`` ranges and buckets for the bucketed relative encodings (T5, Shaw, iRPE).

The source article's second future direction (``000_*.txt`` section 5, "adaptive relative
position encoding"): the number of buckets and the range of relative distances are tuned by
hand today; let them follow the data instead, "widening the range for long text, adding buckets
for images dense with small objects". Two rules, both deterministic functions of integers:

1. Settings from the trained extent (``L`` = the trained context of a text model, ``S`` =
   ``max(height, width)`` of the trained grid):

   - T5 ``num_buckets``: ``max_exact = ceil(log2 L) - 1`` exact distances per side (one per
     doubling of the context, less one) and as many log-spaced ones, so ``4 max_exact``
     buckets bidirectional and ``2 max_exact`` causal: T5's own 32 at its 512 tokens;
   - T5 ``max_distance = max(ceil(L / 4), 2 max_exact)``: a quarter of the context, T5's own
     128 at its trained 512 tokens (Raffel et al. 2020, section 2.1), and at least a log band as
     long as the exact one (``max_exact`` = half the buckets per side);
   - Shaw ``max_distance = ceil(L / 4)``, at least 1: the clip at the same quarter of the context;
   - iRPE ``ratio = S / 8``, so ``alpha : beta : gamma = S/8 : S/4 : S``, the official 1 : 2 : 8
     shape with the logarithmic band ending at the grid's side (on DeiT's 14 x 14 the official
     ratio 1.9 gives gamma 15.2 and 49 product buckets; S / 8 gives 14 and 49 too).

2. At evaluation, the far band follows the input (``rescale``), FIRE's progressive
   normalisation (Li et al. 2023, ``psi(i - j) / psi(max(L, i))``) applied to the bucket range
   only, so the near band keeps its exact buckets:

   - 1D: query i's context ``c_i = 1 + `` the distance to its farthest key (the first key when
     causal) and its stretch ``s_i = max(1, c_i / L)``; T5's ``max_distance`` becomes
     ``max_distance * s_i``, Shaw's distances past ``h = floor(k / 2)`` map to ``h + (|d| - h) /
     s_i`` (interpolated between the two nearest rows), clipped at ``k``;
   - 2D: the grid's side ``S' = 1 + `` the largest row or column offset the call spans and
     ``s = max(1, S' / S)``; iRPE's ``gamma`` becomes ``gamma * s``.

   Inside the trained extent every ``s`` is 1, so training sees the plain encoding.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from torch import Tensor

from posenc_cli.errors import UsageError

AUTO = "auto"
Auto = Literal["auto"]


def is_auto(value: Any) -> bool:
    return isinstance(value, str) and value == AUTO


def check_extent(name: str, key: str, value: int | None, why: str, other: str) -> int:
    """``value`` as a positive int, or a UsageError naming ``key`` and two ways out."""
    if value is None:
        raise UsageError(
            f"{name}: {why} needs {key} (the extent the model is trained at); set "
            f"encoding {key}, or {other}"
        )
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{name}: {key} must be an integer >= 1, got {value!r}")
    return value


def t5_num_buckets(train_length: int, bidirectional: bool) -> int:
    """T5's bucket count: ``max_exact = ceil(log2 L) - 1`` (at least 1) exact buckets per side
    and as many log-spaced ones; both sides when bidirectional."""
    max_exact = max(1, math.ceil(math.log2(max(train_length, 2))) - 1)
    return 2 * max_exact * (2 if bidirectional else 1)


def t5_max_distance(train_length: int, max_exact: int) -> int:
    """T5's ``max_distance``: a quarter of the trained context, at least twice ``max_exact``."""
    return max(-(-train_length // 4), 2 * max_exact)


def shaw_max_distance(train_length: int) -> int:
    """Shaw's clip ``k`` for a model trained at ``train_length`` tokens (rule 1)."""
    return max(1, -(-train_length // 4))


def irpe_ratio(height: int, width: int) -> float:
    """iRPE's ratio (``alpha = r``, ``beta = 2r``, ``gamma = 8r``) for the trained grid."""
    return max(height, width) / 8


def contexts(q_pos: Tensor, k_pos: Tensor, both_sides: bool) -> Tensor:
    """``c_i``, ``(Nq,)`` int64: 1 + the distance from query i to its farthest key; with
    ``both_sides`` False (causal) the farthest visible key is the first one."""
    reach = q_pos - k_pos.min()
    if both_sides:
        reach = torch.maximum(reach, k_pos.max() - q_pos)
    return reach.clamp(min=0) + 1


def stretch(q_pos: Tensor, k_pos: Tensor, both_sides: bool, train_length: int) -> Tensor:
    """``s_i = max(1, c_i / L)`` per query, ``(Nq,)`` float64 (rule 2)."""
    return (contexts(q_pos, k_pos, both_sides).double() / train_length).clamp(min=1.0)


def stretches(q_pos: Tensor, k_pos: Tensor, both_sides: bool, train_length: int) -> bool:
    """Whether any query's context is longer than the trained one (so rule 2 changes ids)."""
    if len(q_pos) == 0 or len(k_pos) == 0:
        return False
    return bool(contexts(q_pos, k_pos, both_sides).max() > train_length)


def grid_stretch(reach: tuple[int, int], trained_side: int) -> float:
    """``s = max(1, S' / S)`` for a call whose offsets reach ``reach`` (rule 2, 2D)."""
    return max(1.0, (max(reach) + 1) / trained_side)


__all__ = [
    "AUTO",
    "Auto",
    "check_extent",
    "contexts",
    "grid_stretch",
    "irpe_ratio",
    "is_auto",
    "shaw_max_distance",
    "stretch",
    "stretches",
    "t5_max_distance",
    "t5_num_buckets",
]

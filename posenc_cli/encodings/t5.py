"""T5 bucketed relative position bias.

Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a Unified Text-to-Text
Transformer" (JMLR), section 2.1: one learned scalar per (bucket, head) is added to the attention
logits; buckets are exact for small distances and logarithmically wider up to ``max_distance``;
the table is shared by all layers.

Conventions (DESIGN.md section 3):

- Relative position = key - query (``j - i``), as in the T5 reference code.
- Bidirectional: half of the buckets per sign; positive positions (keys after the query) are
  offset by ``num_buckets / 2``. Per side, ``max_exact = (buckets per side) / 2`` distances get a
  bucket each; a distance ``d >= max_exact`` maps to
  ``max_exact + floor(log(d / max_exact) / log(max_distance / max_exact) * (n - max_exact))``
  capped at the side's last bucket ``n - 1``; ``n`` is the number of buckets per side.
  As in the reference code, bucket ``n`` (positive side, distance 0) is never used.
- Unidirectional (causal): only non-positive relative positions count, with all buckets;
  positive ones (future keys, masked anyway) fall into bucket 0 together with distance 0.
- ``bidirectional=None`` means "not causal", the T5 encoder/decoder split.
- The logarithm is evaluated in float64 (the reference code uses float32); the two agree for
  every distance at the default and the tested settings.
- Scale: T5 does not multiply q.k by 1/sqrt(d); it folds that factor into the initialisation of
  the query projection. posenc keeps the default 1/sqrt(d) on the content term (an equivalent
  reparametrisation) and adds the bias unscaled, in logit units.
- Initialisation: normal with std ``(heads * head_dim) ** -0.5``, as the Hugging Face T5 port does
  with ``d_model ** -0.5`` (``heads * head_dim`` equals ``d_model`` in our models).
- Efficiency: bucket ids for distances ``-max_distance .. max_distance`` are computed once into a
  lookup table; every larger distance shares the last bucket of its side, so each call clamps the
  relative positions and indexes the table (no logarithm per query-key pair). Buckets stop
  changing even earlier (from distance 91 with the defaults): ``attend`` sends the keys past that
  distance through the flash kernel on inputs of at least ``SATURATED_MIN_KEYS`` times it
  (``kernels/clipped_attention.py``); shorter ones take the fused path with
  ``kernels/biased_sdpa.py``.

Adaptive settings (the source article's section 5, "adaptive relative position encoding";
rules in ``encodings/adaptive.py``):

- ``max_distance: auto`` comes from ``train_length`` (the trained context ``L``):
  ``max(ceil(L / 4), 2 max_exact)``, a quarter of the context (T5's own 128 at its trained 512
  tokens) and at least a log band as long as the exact one. ``num_buckets: auto`` gives
  ``max_exact = ceil(log2 L) - 1`` exact buckets per side and as many log-spaced ones (32
  bidirectional at 512 tokens, T5's own).
- ``rescale`` (on by default with ``max_distance: auto``): query i's log band ends at
  ``max_distance * max(1, c_i / L)``, ``c_i`` = 1 + the distance to its farthest key (the first
  key when causal), FIRE's progressive normalisation on the log band only. Inside the trained
  context nothing changes; past it the bias is no longer a function of ``j - i`` alone, so a
  rescaled instance is not ``toeplitz`` and writes its own ``score_mod``.
- ``breakpoints: learned``: ``max_exact = m0 exp(log_exact)`` and ``max_distance = max_exact +
  (M0 - m0) exp(log_span)`` are learned (positive and ordered by construction; both logs start
  at 0, so the initial breakpoints are exactly the integers ``m0``, ``M0``). While they require
  gradients each pair reads its entry interpolated between the two neighbouring buckets of the
  continuous index (``kernels/soft_index.py``), so gradients reach them; frozen
  (``requires_grad_(False)``), pairs read the hard bucket ``floor(u)``, which at the initial
  breakpoints is exactly the fixed function.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

from posenc_cli.encodings import adaptive
from posenc_cli.encodings.adaptive import Auto, is_auto
from posenc_cli.encodings.base import PositionEncoding, relative_positions, table_bias
from posenc_cli.errors import UsageError
from posenc_cli.kernels import clipped_attention, soft_index
from posenc_cli.kernels.positions import consecutive

Breakpoints = Literal["fixed", "learned"]


def split_buckets(num_buckets: int, bidirectional: bool) -> tuple[int, int]:
    """Buckets per side and ``max_exact`` (half of them); raises UsageError if unusable."""
    if bidirectional and (num_buckets < 4 or num_buckets % 2):
        raise UsageError(
            f"t5: num_buckets must be even and >= 4 when bidirectional, got {num_buckets}"
        )
    if num_buckets < 2:
        raise UsageError(f"t5: num_buckets must be >= 2, got {num_buckets}")
    per_side = num_buckets // 2 if bidirectional else num_buckets
    return per_side, per_side // 2


def bucket_layout(num_buckets: int, max_distance: int, bidirectional: bool) -> tuple[int, int]:
    """Buckets per side and ``max_exact`` for these settings; raises UsageError if unusable."""
    per_side, max_exact = split_buckets(num_buckets, bidirectional)
    if max_distance <= max_exact:
        raise UsageError(
            f"t5: max_distance must be > {max_exact} (half the buckets per side), "
            f"got {max_distance}; raise max_distance or lower num_buckets"
        )
    return per_side, max_exact


def relative_position_bucket(
    relative_position: Tensor,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> Tensor:
    """T5 bucket id of each relative position (key - query), same shape, int64."""
    per_side, max_exact = bucket_layout(num_buckets, max_distance, bidirectional)
    rel = relative_position.long()
    if bidirectional:
        side = (rel > 0).long() * per_side  # keys after the query use the upper half
        distance = rel.abs()
    else:
        side = torch.zeros_like(rel)
        distance = (-rel).clamp(min=0)  # future keys count as distance 0
    # Clamp below so the logarithm never sees 0; those entries take the exact branch anyway.
    far = distance.clamp(min=max_exact).double() / max_exact
    steps = torch.log(far) / math.log(max_distance / max_exact) * (per_side - max_exact)
    log_bucket = (max_exact + steps.floor().long()).clamp(max=per_side - 1)
    return side + torch.where(distance < max_exact, distance, log_bucket)


def sides(rel: Tensor, bidirectional: bool, per_side: int) -> tuple[Tensor, Tensor]:
    """``(offset of the side's first bucket, distance)`` of relative positions, as above."""
    if bidirectional:
        return (rel > 0).long() * per_side, rel.abs()
    return torch.zeros_like(rel), (-rel).clamp(min=0)


def log_buckets(
    distance: Tensor, max_exact: float, max_distance: float | Tensor, per_side: int
) -> Tensor:
    """T5's bucket within one side of distances ``>= 0`` (int64) at real breakpoints: the floor
    of ``soft_index.t5_index``, written with the operations of ``relative_position_bucket`` (the
    integer part of ``max_exact`` added after the floor), so that integer breakpoints give
    exactly its ids. ``max_distance`` may be a tensor broadcasting against ``distance``."""
    far = distance.double().clamp(min=max_exact) / max_exact
    if isinstance(max_distance, Tensor):
        span = torch.log(max_distance.double() / max_exact)
    else:
        span = math.log(max_distance / max_exact)
    steps = torch.log(far) / span * (per_side - max_exact)
    whole = math.floor(max_exact)
    log_bucket = (whole + (steps + (max_exact - whole)).floor().long()).clamp(max=per_side - 1)
    return torch.where(distance < max_exact, distance, log_bucket)


def resolve(
    num_buckets: int | Auto, max_distance: int | Auto, bidirectional: bool,
    train_length: int | None,
) -> tuple[int, int]:  # fmt: skip
    """``(num_buckets, max_distance)``, each ``auto`` replaced by the rules of
    ``encodings/adaptive.py``."""
    if is_auto(num_buckets):
        length = adaptive.check_extent(
            "t5", "train_length", train_length, "num_buckets 'auto'", "give a number"
        )
        num_buckets = adaptive.t5_num_buckets(length, bidirectional)
    if not is_auto(max_distance):
        return int(num_buckets), int(max_distance)
    length = adaptive.check_extent(
        "t5", "train_length", train_length, "max_distance 'auto'", "give a number"
    )
    _, max_exact = split_buckets(int(num_buckets), bidirectional)
    return int(num_buckets), adaptive.t5_max_distance(length, max_exact)


class T5Bias(PositionEncoding):
    """A learned scalar per (bucket, head) added to the logits; one instance for all layers."""

    content_free = True  # the bias reads positions only
    family = "bias"
    per_layer = False

    def __init__(
        self,
        *,
        num_buckets: int | Auto = 32,
        max_distance: int | Auto = 128,
        bidirectional: bool | None = None,
        train_length: int | None = None,
        rescale: bool | None = None,
        breakpoints: Breakpoints = "fixed",
        heads: int = 8,
        head_dim: int = 64,
        causal: bool = False,
    ) -> None:
        super().__init__(heads=heads, head_dim=head_dim, causal=causal)
        if heads < 1:
            raise UsageError(f"t5: heads must be >= 1, got {heads}")
        if breakpoints not in ("fixed", "learned"):
            raise UsageError(f"t5: breakpoints must be 'fixed' or 'learned', got {breakpoints!r}")
        self.bidirectional = (not causal) if bidirectional is None else bidirectional
        # rule 2 of encodings/adaptive.py: on by default exactly when the range is 'auto'
        auto = is_auto(max_distance) or is_auto(num_buckets)
        num_buckets, max_distance = resolve(
            num_buckets, max_distance, self.bidirectional, train_length
        )
        self.per_side, self.max_exact = bucket_layout(num_buckets, max_distance, self.bidirectional)
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.rescale = auto if rescale is None else rescale
        if self.rescale:
            adaptive.check_extent(
                "t5", "train_length", train_length, "rescale", "set rescale false"
            )
        self.train_length = train_length
        self.breakpoints = breakpoints
        self.table = nn.Embedding(
            num_buckets, heads
        )  # (nb, H): HF T5's layout, so its tables load as they are
        nn.init.normal_(self.table.weight, std=(heads * head_dim) ** -0.5)
        # Bucket of every relative position in -max_distance .. max_distance; beyond that range
        # the bucket no longer changes, so clamped positions index this table exactly.
        span = torch.arange(-max_distance, max_distance + 1)  # (2 md + 1,)
        lookup = relative_position_bucket(span, self.bidirectional, num_buckets, max_distance)
        self.register_buffer("lookup", lookup, persistent=False)
        # the part of it where buckets still change: the near band of the clipped kernel
        band = clipped_attention.saturated_core(lookup)
        self.register_buffer("band_lookup", band, persistent=False)
        if breakpoints == "learned":
            # log multipliers of max_exact and of the gap up to max_distance, 0 at the start
            self.log_exact = nn.Parameter(torch.zeros(()))
            self.log_span = nn.Parameter(torch.zeros(()))

    def extra_repr(self) -> str:
        extra = f", train_length={self.train_length}" if self.train_length else ""
        extra += ", rescale=True" if self.rescale else ""
        extra += ", breakpoints=learned" if self.learned else ""
        return (
            f"num_buckets={self.num_buckets}, max_distance={self.max_distance}, "
            f"bidirectional={self.bidirectional}{extra}"
        )

    @property
    def toeplitz(self) -> bool:
        """A function of ``j - i`` alone, unless the range follows each query's context."""
        return not self.rescale

    @property
    def learned(self) -> bool:
        return self.breakpoints == "learned"

    @property
    def soft(self) -> bool:
        """Interpolated reads while the learned breakpoints require gradients; hard when frozen."""
        return self.learned and (self.log_exact.requires_grad or self.log_span.requires_grad)

    def breakpoint_values(self) -> tuple[Tensor, Tensor]:
        """The learned ``(max_exact, max_distance)``, float64 scalars with their gradients."""
        m0, big = float(self.max_exact), float(self.max_distance)
        exact = (m0 * self.log_exact.double().exp()).clamp(max=self.per_side - 1)
        return exact, exact + (big - m0) * self.log_span.double().exp()

    def stretched(self, q_pos: Tensor, k_pos: Tensor) -> bool:
        """Whether rule 2 moves some query's range here (a context past ``train_length``)."""
        return self.rescale and adaptive.stretches(
            q_pos, k_pos, self.bidirectional, self.train_length
        )

    def stretch(self, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """``(Nq, 1)`` factors on ``max_distance`` (rule 2), or None where all are 1."""
        if not self.stretched(q_pos, k_pos):
            return None
        return adaptive.stretch(q_pos, k_pos, self.bidirectional, self.train_length)[:, None]

    def points(self) -> tuple[Tensor, Tensor] | tuple[float, float]:
        """The breakpoints ``index`` reads: tensors for soft reads, else Python floats (the
        fixed function's arithmetic, so integer breakpoints give its ids exactly)."""
        if not self.learned:
            return float(self.max_exact), float(self.max_distance)
        exact, far = self.breakpoint_values()
        return (exact, far) if self.soft else (exact.item(), far.item())

    def index(
        self, rel: Tensor, scale: Tensor | None, points=None
    ) -> Tensor | tuple[Tensor, Tensor, Tensor]:
        """Bucket ids of relative positions ``rel`` with the log band's end multiplied by
        ``scale`` (broadcasting against ``rel``; None = 1): int64 ids, or ``(lo, hi, w)`` while
        the reads are soft. Elementwise, so the score_mod calls it on single pairs too, with
        ``points`` (``self.points()``) read once outside."""
        md = self.max_distance
        if not self.learned and scale is None:  # the plain function: one table lookup
            return self.lookup[rel.clamp(-md, md) + md]
        side, distance = sides(rel, self.bidirectional, self.per_side)
        exact, far = self.points() if points is None else points
        if self.soft:
            top = far if scale is None else far * scale
            u = soft_index.t5_index(distance.double(), exact, top, self.per_side)
            lo, hi, w = soft_index.neighbours(u, self.per_side - 1)
            return side + lo, side + hi, w
        if self.learned:  # frozen: the hard buckets at the breakpoints reached
            plain = side + log_buckets(distance, exact, far, self.per_side)
        else:  # past max_distance every distance shares its side's last bucket
            plain = self.lookup[rel.clamp(-md, md) + md]
        if scale is None:
            return plain
        stretched = side + log_buckets(distance, exact, far * scale, self.per_side)
        return torch.where(scale > 1, stretched, plain)  # unstretched rows stay exact

    def bucket_ids(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """Bucket id of every (query, key) pair, ``(Nq, Nk)`` (soft reads: the lower bucket)."""
        ids = self.index(relative_positions(q_pos, k_pos), self.stretch(q_pos, k_pos))
        return ids[0] if isinstance(ids, tuple) else ids

    def buckets(self, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, int]:
        return self.bucket_ids(q_pos, k_pos), self.num_buckets

    def attend(self, q, k, v, q_pos, k_pos, scale, causal, key_mask=None) -> Tensor | None:
        """Past a distance K the bucket stops changing, so on long inputs the far keys go through
        the flash kernel (``kernels/clipped_attention.py``) and only a band of ``2K + 128`` keys
        per 128 queries is computed explicitly. Not for learned breakpoints, nor where the range
        is stretched: there the buckets are not the precomputed band's."""
        if key_mask is not None or self.learned or self.stretched(q_pos, k_pos):
            return None
        viewable = self.toeplitz and consecutive(q_pos) and consecutive(k_pos)
        if not torch.is_grad_enabled() and viewable:
            # no table gradient: the flash kernel reads the distance table as a view and no
            # band is computed explicitly (kernels/blocked_bias.py; 1.02x of none against this
            # kernel's 1.53x in posenc profile at N = 2048)
            return None
        keys = clipped_attention.SATURATED_MIN_KEYS * (len(self.band_lookup) // 2)
        usable = k.shape[-2] >= keys and clipped_attention.applies(q, k_pos)
        if not usable:
            return None
        table = self.table.weight.t().to(q.dtype)  # (H, nb)
        return clipped_attention.saturating_bias_attention(
            q, k, v, table, self.band_lookup, scale, causal
        )

    def read(self, ids: Tensor | tuple[Tensor, Tensor, Tensor]) -> Tensor:
        """The bias ``(1, H, ...)`` at hard ids or interpolated at soft ones."""
        table = self.table.weight.t()  # (H, nb)
        if not isinstance(ids, tuple):
            return table_bias(table, ids)
        lo, hi, w = ids
        w = w.to(table.dtype)
        return table_bias(table, lo) * (1 - w) + table_bias(table, hi) * w

    def bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        ids = self.index(relative_positions(q_pos, k_pos), self.stretch(q_pos, k_pos))
        return self.read(ids)  # (1, H, Nq, Nk)

    def score_mod(self, q: Tensor, q_pos: Tensor, k_pos: Tensor):
        """The rescaled bias one pair at a time, for FlexAttention (the toeplitz paths serve the
        rest): the pair's stretch from its query's context, then ``index`` on the pair."""
        if not self.rescale:
            return None
        table = self.table.weight.t().to(q.dtype)  # (H, nb)
        first, last, L = k_pos.min(), k_pos.max(), float(self.train_length)
        both, points = self.bidirectional, self.points()

        def mod(score, b, h, q_idx, kv_idx):
            i, j = q_pos[q_idx], k_pos[kv_idx]
            reach = torch.maximum(i - first, last - i) if both else i - first
            stretch = ((reach.clamp(min=0) + 1).double() / L).clamp(min=1.0)
            ids = self.index(j - i, stretch, points)
            if not isinstance(ids, tuple):
                return score + table[h, ids]
            lo, hi, w = ids
            w = w.to(score.dtype)
            return score + table[h, lo] * (1 - w) + table[h, hi] * w

        return mod

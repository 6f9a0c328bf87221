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
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from posenc_cli.encodings.base import PositionEncoding, relative_positions, table_bias
from posenc_cli.errors import UsageError
from posenc_cli.kernels import clipped_attention


def bucket_layout(num_buckets: int, max_distance: int, bidirectional: bool) -> tuple[int, int]:
    """Buckets per side and ``max_exact`` for these settings; raises UsageError if unusable."""
    if bidirectional and (num_buckets < 4 or num_buckets % 2):
        raise UsageError(
            f"t5: num_buckets must be even and >= 4 when bidirectional, got {num_buckets}"
        )
    if num_buckets < 2:
        raise UsageError(f"t5: num_buckets must be >= 2, got {num_buckets}")
    per_side = num_buckets // 2 if bidirectional else num_buckets
    max_exact = per_side // 2
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


class T5Bias(PositionEncoding):
    """A learned scalar per (bucket, head) added to the logits; one instance for all layers."""

    content_free = True  # the bias reads positions only
    toeplitz = True  # ... and depends on j - i alone
    family = "bias"
    per_layer = False

    def __init__(
        self,
        *,
        num_buckets: int = 32,
        max_distance: int = 128,
        bidirectional: bool | None = None,
        heads: int = 8,
        head_dim: int = 64,
        causal: bool = False,
    ) -> None:
        super().__init__(heads=heads, head_dim=head_dim, causal=causal)
        if heads < 1:
            raise UsageError(f"t5: heads must be >= 1, got {heads}")
        self.bidirectional = (not causal) if bidirectional is None else bidirectional
        bucket_layout(num_buckets, max_distance, self.bidirectional)  # validate early
        self.num_buckets = num_buckets
        self.max_distance = max_distance
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

    def extra_repr(self) -> str:
        return (
            f"num_buckets={self.num_buckets}, max_distance={self.max_distance}, "
            f"bidirectional={self.bidirectional}"
        )

    def bucket_ids(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """Bucket id of every (query, key) pair, ``(Nq, Nk)``."""
        rel = relative_positions(q_pos, k_pos)  # (Nq, Nk)
        md = self.max_distance
        return self.lookup[rel.clamp(-md, md) + md]

    def buckets(self, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, int]:
        return self.bucket_ids(q_pos, k_pos), self.num_buckets

    def attend(self, q, k, v, q_pos, k_pos, scale, causal) -> Tensor | None:
        """Past a distance K the bucket stops changing, so on long inputs the far keys go through
        the flash kernel (``kernels/clipped_attention.py``) and only a band of ``2K + 128`` keys
        per 128 queries is computed explicitly."""
        keys = clipped_attention.SATURATED_MIN_KEYS
        if not torch.is_grad_enabled():  # no table gradient: the fused mask path holds longer
            keys = clipped_attention.SATURATED_MIN_KEYS_NO_GRAD
        usable = k.shape[-2] >= keys * (len(self.band_lookup) // 2) and clipped_attention.applies(
            q, k_pos
        )
        if not usable:
            return None
        table = self.table.weight.t().to(q.dtype)  # (H, nb)
        return clipped_attention.saturating_bias_attention(
            q, k, v, table, self.band_lookup, scale, causal
        )

    def bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        ids = self.bucket_ids(q_pos, k_pos)  # (Nq, Nk)
        return table_bias(self.table.weight.t(), ids)  # (1, H, Nq, Nk)

"""Shaw, Uszkoreit, Vaswani 2018, "Self-Attention with Relative Position Representations".

The paper's equations, for one head of size d (eq. 3-4; eq. 5-6 define the clipping):

    e_ij = q_i . (k_j + a^K_ij) / sqrt(d)        (key term, eq. 4)
    z_i  = sum_j alpha_ij (v_j + a^V_ij)          (value term, eq. 3)
    a^K_ij = w^K[clip(j - i, k)],  a^V_ij = w^V[clip(j - i, k)],  clip(x, k) = max(-k, min(k, x))

Conventions:
- Relative distance is key minus query, ``j - i`` (as in the paper and ``relative_positions``);
  row ``clip(j - i) + k`` of a ``(2k + 1, d)`` table holds the embedding of distance ``j - i``.
- ``k = 0`` is allowed: a single bucket, so the model has no position information at all
  (Shaw's k = 0 ablation). The source article says k = 4 is usually enough; Shaw used
  k = 16 (base) and k = 8 (big), and reports dev BLEU flat for k >= 2.
- The tables are shared across heads and owned by each layer, as in the paper ("shared across
  attention heads"; each layer has its own representations).
- The key term is scaled by the same 1/sqrt(d) as the content term, as in eq. 4.
- Initialisation: Xavier/Glorot uniform, std = sqrt(2 / (2k + 1 + d)) ~ sqrt(2/d): the same
  order per coordinate as a projected token, so from the first step the key term is a modest,
  non-zero addition to q.k and the value term to attn @ v (the paper does not state its
  initialiser; BERT's std 0.02 would make both terms nearly invisible at first).

Efficiency: on the CPU, over consecutive positions and above ``MIN_PAIRS`` (query, key) pairs,
``attend`` hands the whole attention to ``kernels/clipped_attention.py``: past distance k every
pair of a query falls in one of the two end buckets, so those keys go through the flash kernel
and only a band of about 2k + 128 keys per block of 128 queries is computed explicitly.
Elsewhere the generic hooks apply: the key term is ``q @ w^K.T`` once per bucket,
``(B, H, Nq, 2k+1)``, then gathered by bucket id; the value term sums attention weights per
bucket and multiplies by ``w^V``. Neither builds an ``(Nq, Nk, d)`` tensor (the paper's own
implementation builds ``(N, N, d)``).

Adaptive clip (the source article's section 5, "adaptive relative position encoding"; rules in
``encodings/adaptive.py``): ``max_distance: auto`` is ``ceil(train_length / 4)``, the quarter of
the trained context at which T5's defaults put their range. ``rescale`` (on by default with
``auto``) keeps rows ``|d| <= h = floor(k / 2)`` exact and reads a farther distance at
``h + (|d| - h) / s_i``, ``s_i = max(1, c_i / train_length)`` and ``c_i`` = 1 + the distance from
query i to its farthest key (the first key when causal), interpolated between the two nearest
rows and clipped at ``k``: the clip moves out with each query's context, FIRE's progressive
normalisation on the far band. Inside the trained context every ``s_i`` is 1 and nothing
changes; past it the key and value terms read two rows per pair (still no ``(Nq, Nk, d)``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc_cli.encodings import adaptive
from posenc_cli.encodings.adaptive import Auto, is_auto
from posenc_cli.encodings.base import PositionEncoding, relative_positions
from posenc_cli.errors import UsageError
from posenc_cli.kernels import clipped_attention, soft_index
from posenc_cli.kernels.buckets import gather_buckets, sum_per_bucket


def shaw_buckets(q_pos: Tensor, k_pos: Tensor, max_distance: int) -> Tensor:
    """Table row of every pair, ``clip(j - i, -k, k) + k`` in ``[0, 2k]``: ``(Nq, Nk)`` long."""
    rel = relative_positions(q_pos, k_pos)  # (Nq, Nk), j - i
    return rel.clamp(-max_distance, max_distance) + max_distance


class ShawRelative(PositionEncoding):
    """Learned, clipped relative embeddings on the keys (a^K) and on the values (a^V)."""

    family = "relative"
    per_layer = True

    def __init__(
        self,
        *,
        max_distance: int | Auto = 4,
        key: bool = True,
        value: bool = True,
        train_length: int | None = None,
        rescale: bool | None = None,
        heads: int = 8,
        head_dim: int = 64,
        causal: bool = False,
    ) -> None:
        super().__init__(heads=heads, head_dim=head_dim, causal=causal)
        auto = is_auto(max_distance)
        if auto:
            length = adaptive.check_extent(
                "shaw", "train_length", train_length, "max_distance 'auto'", "give a number"
            )
            max_distance = adaptive.shaw_max_distance(length)
        self.rescale = auto if rescale is None else rescale
        if self.rescale:
            adaptive.check_extent(
                "shaw", "train_length", train_length, "rescale", "set rescale false"
            )
        self.train_length = train_length
        max_distance = int(max_distance)
        if max_distance < 0:
            raise UsageError(
                f"shaw.max_distance must be >= 0 (0 = no position information), got {max_distance}"
            )
        if not (key or value):
            raise UsageError(
                "shaw: key and value are both false; set key=true or value=true, "
                "or use encoding 'none'"
            )
        self.max_distance = max_distance
        self.use_key = key
        self.num_buckets = 2 * max_distance + 1
        # Only the tables that are used exist, so every parameter receives a gradient.
        self.key_table = nn.Parameter(torch.empty(self.num_buckets, head_dim)) if key else None
        self.value_table = nn.Parameter(torch.empty(self.num_buckets, head_dim)) if value else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for table in (self.key_table, self.value_table):
            if table is not None:
                nn.init.xavier_uniform_(table)

    @property
    def uses_value(self) -> bool:
        return self.value_table is not None

    def soft_rows(self, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor, Tensor] | None:
        """``(lo, hi, w)`` table rows of every pair under rule 2, ``(Nq, Nk)`` each, or None
        where no query's context is past ``train_length`` (then the plain clip applies)."""
        both, L = not self.causal, self.train_length
        if not (self.rescale and adaptive.stretches(q_pos, k_pos, both, L)):
            return None
        k, near = self.max_distance, self.max_distance // 2
        scale = adaptive.stretch(q_pos, k_pos, both, L)[:, None]  # (Nq, 1)
        rel = relative_positions(q_pos, k_pos)  # (Nq, Nk), j - i
        size = rel.abs().double()
        far = torch.where(size <= near, size, near + (size - near) / scale).clamp(max=k)
        return soft_index.neighbours(torch.sign(rel) * far + k, 2 * k)

    def buckets(self, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, int]:
        soft = self.soft_rows(q_pos, k_pos)
        if soft is None:
            return shaw_buckets(q_pos, k_pos, self.max_distance), self.num_buckets
        lo, hi, w = soft
        return torch.where(w > 0.5, hi, lo), self.num_buckets  # the nearer row

    def bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        if self.key_table is None:
            return None
        per_bucket = q @ self.key_table.T  # (B, H, Nq, 2k+1)
        soft = self.soft_rows(q_pos, k_pos)
        if soft is None:
            ids = shaw_buckets(q_pos, k_pos, self.max_distance)  # (Nq, Nk)
            return gather_buckets(per_bucket, ids) * self.logit_scale()  # (B, H, Nq, Nk)
        lo, hi, w = soft
        w = w.to(per_bucket.dtype)
        term = gather_buckets(per_bucket, lo) * (1 - w) + gather_buckets(per_bucket, hi) * w
        return term * self.logit_scale()

    def value(self, attn: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        if self.value_table is None:
            return None
        soft = self.soft_rows(q_pos, k_pos)
        if soft is None:
            ids = shaw_buckets(q_pos, k_pos, self.max_distance)  # (Nq, Nk)
            weight = sum_per_bucket(attn, ids, self.num_buckets)  # (B, H, Nq, 2k+1)
        else:  # each pair's weight split between its two rows
            lo, hi, w = soft
            w = w.to(attn.dtype)
            weight = sum_per_bucket(attn * (1 - w), lo, self.num_buckets)
            weight = weight + sum_per_bucket(attn * w, hi, self.num_buckets)
        return weight @ self.value_table  # (B, H, Nq, d)

    def attend(self, q, k, v, q_pos, k_pos, scale, causal, key_mask=None) -> Tensor | None:
        large = q.shape[-2] * k.shape[-2] > clipped_attention.MIN_PAIRS
        if key_mask is not None or not (large and clipped_attention.applies(q, k_pos)):
            return None
        if self.rescale and adaptive.stretches(q_pos, k_pos, not self.causal, self.train_length):
            return None  # the stretched rows are not the clipped kernel's
        return clipped_attention.clipped_relative_attention(
            q, k, v, self.key_table, self.value_table, self.max_distance, scale,
            self.logit_scale(), causal,
        )  # fmt: skip

    def extra_repr(self) -> str:
        extra = f", train_length={self.train_length}, rescale=True" if self.rescale else ""
        return (
            f"max_distance={self.max_distance}, key={self.use_key}, value={self.uses_value}" + extra
        )

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
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc_cli.encodings.base import PositionEncoding, relative_positions
from posenc_cli.errors import UsageError
from posenc_cli.kernels import clipped_attention
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
        max_distance: int = 4,
        key: bool = True,
        value: bool = True,
        heads: int = 8,
        head_dim: int = 64,
        causal: bool = False,
    ) -> None:
        super().__init__(heads=heads, head_dim=head_dim, causal=causal)
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

    def buckets(self, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, int]:
        return shaw_buckets(q_pos, k_pos, self.max_distance), self.num_buckets

    def bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        if self.key_table is None:
            return None
        ids = shaw_buckets(q_pos, k_pos, self.max_distance)  # (Nq, Nk)
        per_bucket = q @ self.key_table.T  # (B, H, Nq, 2k+1)
        return gather_buckets(per_bucket, ids) * self.logit_scale()  # (B, H, Nq, Nk)

    def value(self, attn: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        if self.value_table is None:
            return None
        ids = shaw_buckets(q_pos, k_pos, self.max_distance)  # (Nq, Nk)
        weight = sum_per_bucket(attn, ids, self.num_buckets)  # (B, H, Nq, 2k+1)
        return weight @ self.value_table  # (B, H, Nq, d)

    def attend(self, q, k, v, q_pos, k_pos, scale, causal) -> Tensor | None:
        large = q.shape[-2] * k.shape[-2] > clipped_attention.MIN_PAIRS
        if not (large and clipped_attention.applies(q, k_pos)):
            return None
        return clipped_attention.clipped_relative_attention(
            q, k, v, self.key_table, self.value_table, self.max_distance, scale,
            self.logit_scale(), causal,
        )  # fmt: skip

    def extra_repr(self) -> str:
        return f"max_distance={self.max_distance}, key={self.use_key}, value={self.uses_value}"

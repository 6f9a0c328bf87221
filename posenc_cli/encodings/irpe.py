"""iRPE: image relative position encoding on queries, keys and values.

Wu, Peng, Chen, Fu, Chao 2021, "Rethinking and Improving Relative Position Encoding for Vision
Transformer" (ICCV). For one head of size d, with ``s = 1/sqrt(d)``, ``b(i, j)`` the bucket of
the 2D offset ``p_i - p_j`` (query minus key) and ``r^Q, r^K, r^V`` learned tables:

    e_ij = s q_i . k_j  +  s q_i . r^K[b(i, j)]  +  s k_j . r^Q[b(j, i)]     (contextual, Eq. 14)
    e_ij = s q_i . k_j  +  r^K[b(i, j)]  +  r^Q[b(j, i)]                     (bias mode)
    z_i  = sum_j a_ij v_j  +  sum_j a_ij r^V[b(i, j)]                         (values, Eq. 15)

Each term is present only when its letter is in ``on``. The bucket functions (piecewise index,
the euclidean / quant / cross / product methods, the shared prefix bucket) are the pure functions
of ``irpe_index`` and are re-exported here.

Conventions, checked against the official code, microsoft/Cream ``iRPE/DeiT-with-iRPE/irpe.py``
and ``rpe_vision_transformer.py`` (``RPEAttention``):

- Offsets are query minus key, ``(dr, dc)``, as the official ``diff = pos1 - pos2``. Keys and
  values read ``b(i, j)``. The query term reads the transposed bucket ``b(j, i)`` (the offset key
  minus query): the official code evaluates its transposed iRPE on the keys and transposes the
  result (``rpe_q(k * scale).transpose(2, 3)``). For euclidean and quant ``b`` is symmetric; for
  product and cross it is not, so this matters.
- Scale: the official code multiplies q by ``1/sqrt(d)`` before both ``q k^T`` and the key term,
  and passes ``k * scale`` to the query term, so both contextual terms are scaled like ``q . k``.
  Bias-mode tables are added to the logits unscaled, and the value term is not scaled.
- ``mode="bias"`` with ``v`` in ``on`` is a UsageError: the official code raises
  NotImplementedError ("Bias non-transposed RPE does not exist"); a scalar per bucket added to
  the output would not be a value embedding.
- ``shared_head=True``: one table for all heads (the official builds the module with
  ``num_heads=1``); False: one table per head.
- Table layouts as the official ``lookup_table_weight`` / ``lookup_table_bias``: contextual q/k
  ``(heads|1, d, nb)``, contextual v ``(heads|1, nb, d)``, bias ``(heads|1, nb)``. Cross has a rows
  and a cols table per letter, whose two lookups are summed (the official ``iRPE_Cross``).
- Initialisation: zeros, as the official default (``initializer=None`` leaves the zero tables):
  at the first step the encoding adds nothing, and gradients still reach every table.
- Prefix (class, distillation) tokens: every pair with a prefix token on either side reads one
  shared extra bucket, id ``nb - 1``. Deviation: the official code allocates that bucket only when
  its config says ``skip > 0``; here it always exists, so a model's parameters do not depend on
  the data (on a grid without prefix tokens it is never read). A contextual product encoding on
  keys with shared heads then has ``(7*7 + 1) * d`` parameters per layer at ratio 1.9, as the
  official DeiT-Ti + iRPE (5.72M -> 5.76M over 12 layers).
- Multi-scale buckets (``ratios``), from the source article, not in the official code: one index
  function per ratio, each with its own tables; the terms of all scales are summed.
- Positions are any ``(N, 2)`` grid positions (``grid_positions``; prefix tokens at ``(-1, -1)``),
  also subsets (prefix queries against all keys, patch queries against prefix keys) and grids
  that do not start at 0: ids depend on offsets only.
- Any grid size runs (``extrapolates``): offsets past ``gamma`` share the outermost buckets.
- ``buckets()`` returns the first scale's ids, and for cross its row ids (the column ids are the
  same function of the column offset).

Efficiency (the official code builds an ``(N, N, d)`` value embedding; nothing here does):
key term ``q @ r^K`` once per bucket ``(B, H, Nq, nb)``, then a gather by bucket id; query term
``k @ r^Q`` gathered with the transposed ids; value term ``sum_per_bucket(a) @ r^V``. Cross
does its two lookups as one: ``r_rows[a] + r_cols[b]`` is read from a merged ``(P*P + 1)``-entry
table (``merged_cross_table``, rebuilt from the two learned tables on every call, so gradients
reach both) by one id per pair (``merged_cross_ids``), the same gather as product
(``irpe_pairs.py``). Bucket ids are looked up in an offset table (``bucket_table``) cached per
grid span and device, and the pair ids of the last positions seen are cached per shape (checked
by value, so a stale entry is never used). The cached ids are plain tensors, not buffers: they
live on the positions' device. In contextual mode
``attend`` runs the whole attention with a hand-written backward (``kernels/bucket_attention.py``:
one logits buffer, softmax in place); at DeiT-Ti shape that took q+k from 1.41x to 1.30x of no
iRPE in an interleaved A/B run.

Adaptive buckets (the source article's section 5: "add buckets for images dense with small
objects"; rules in ``encodings/adaptive.py``): ``ratio: auto`` (or any of ``alpha``, ``beta``,
``gamma`` set to ``auto``) takes ``ratio = max(height, width) / 8`` of the trained grid, which the
ViT and DETR pass as ``height`` and ``width``: finer grids get more buckets (7 x 7 product
buckets at 14 x 14, as the official 1.9; 9 x 9 at 16 x 16; 17 x 17 at 32 x 32). ``rescale`` (on
by default with ``auto``) multiplies every scale's ``gamma`` by ``max(1, S' / S)`` on a grid of
side ``S'`` (1 + the largest row or column offset of the call) larger than the trained side
``S``: the logarithmic band stretches to the new grid, the exact band and the table stay.

Learned breakpoints (``breakpoints: learned``): every scale's ``alpha = a0 exp(log_alpha)`` and
``gamma = g0 exp(log_gamma)`` are parameters (kept ``alpha <= beta`` and ``gamma > alpha``);
``beta`` stays, since ``int(beta)`` sizes the tables. While they require gradients each pair
reads its table entry interpolated at the continuous index (``kernels/soft_index.py``): between
two buckets on one axis (euclidean, quant), bilinearly between four for product and cross.
Those reads take the generic hooks (not the contextual kernel). Frozen, the pairs read the hard
buckets at the breakpoints reached, at the start exactly the fixed function's.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc_cli.encodings import adaptive
from posenc_cli.encodings.adaptive import Auto, is_auto
from posenc_cli.encodings.base import PositionEncoding, table_bias
from posenc_cli.encodings.irpe_index import (
    DEFAULT_RATIO,
    METHODS,
    Method,
    bucket_ids,
    bucket_table,
    num_buckets,
    piecewise_index,
)
from posenc_cli.encodings.irpe_pairs import (
    Pairs,
    grid_reach,
    lookup_offsets,
    merged_cross_ids,
    merged_cross_table,
    pair_ids,
    soft_reads,
)
from posenc_cli.encodings.irpe_settings import Params, grid_side, index_scales, resolve_auto
from posenc_cli.errors import UsageError
from posenc_cli.kernels import bucket_attention
from posenc_cli.kernels.biased_sdpa import EXPLICIT_MAX_PAIRS
from posenc_cli.kernels.buckets import gather_buckets, sum_per_bucket

Mode = Literal["bias", "contextual"]
On = Literal["k", "q", "v", "qk", "kv", "qv", "qkv"]
ONS: tuple[str, ...] = ("k", "q", "v", "qk", "kv", "qv", "qkv")
Breakpoints = Literal["fixed", "learned"]
MIN_GAP = 1e-3  # how close a learned gamma may come to alpha (ln(gamma / alpha) > 0)


class ImageRPE(PositionEncoding):
    """iRPE: 2D relative position terms on queries, keys and/or values (bias or contextual)."""

    family = "relative"
    dims = 2
    per_layer = True

    def __init__(
        self,
        *,
        method: Method = "product",
        mode: Mode = "contextual",
        on: On = "k",
        shared_head: bool = True,
        ratio: float | Auto = DEFAULT_RATIO,
        alpha: float | Auto | None = None,
        beta: float | Auto | None = None,
        gamma: float | Auto | None = None,
        ratios: list[float] | None = None,
        height: int | None = None,
        width: int | None = None,
        rescale: bool | None = None,
        breakpoints: Breakpoints = "fixed",
        heads: int = 8,
        head_dim: int = 64,
        causal: bool = False,
    ) -> None:
        super().__init__(heads=heads, head_dim=head_dim, causal=causal)
        if breakpoints not in ("fixed", "learned"):
            raise UsageError(f"irpe.breakpoints must be 'fixed' or 'learned', got {breakpoints!r}")
        self.breakpoints = breakpoints
        auto = any(is_auto(v) for v in (ratio, alpha, beta, gamma))
        self.rescale = auto if rescale is None else rescale
        self.trained_side: int | None = None  # max(height, width), read by rule 2
        if auto or self.rescale:
            self.trained_side = grid_side(height, width, "'auto'" if auto else "rescale")
        ratio, alpha, beta, gamma = resolve_auto(ratio, alpha, beta, gamma, ratios, height, width)
        if method not in METHODS:
            raise UsageError(f"irpe.method must be one of {', '.join(METHODS)}, got {method!r}")
        if mode not in ("bias", "contextual"):
            raise UsageError(f"irpe.mode must be 'bias' or 'contextual', got {mode!r}")
        if on not in ONS:
            raise UsageError(f"irpe.on must be one of {', '.join(ONS)}, got {on!r}")
        if mode == "bias" and "v" in on:
            raise UsageError(
                f"irpe: mode='bias' has no value term (on={on!r}; the official code has none "
                f"either); set mode='contextual' or drop 'v' from on"
            )
        self.method, self.mode, self.on, self.shared_head = method, mode, on, shared_head
        self.scales = index_scales(ratio, alpha, beta, gamma, ratios)
        # one bucket count per scale, the prefix bucket included (its id is count - 1)
        self.counts = [num_buckets(method, beta, prefix_tokens=1) for _, beta, _ in self.scales]
        self.maps = ("rows", "cols") if method == "cross" else ("",)
        self.tables = self.zero_tables()
        if breakpoints == "learned":  # log multipliers of every scale's alpha and gamma
            self.log_alpha = nn.Parameter(torch.zeros(len(self.scales)))
            self.log_gamma = nn.Parameter(torch.zeros(len(self.scales)))
        self._offset_tables: dict[tuple, tuple[Tensor, ...]] = {}
        self._pair_cache: dict[tuple, tuple[Tensor, Tensor, list[Tensor]]] = {}
        self._slot_cache: dict[tuple, tuple[Tensor, list[Tensor]]] = {}

    def zero_tables(self) -> nn.ParameterDict:
        """A zero table per (letter in ``on``, scale, map), sized by ``counts``, in the official
        layouts: bias ``(H|1, nb)``, contextual q/k ``(H|1, d, nb)``, v ``(H|1, nb, d)``."""
        tables = nn.ParameterDict()
        table_heads = 1 if self.shared_head else self.heads
        for letter in (c for c in "qkv" if c in self.on):
            for s, count in enumerate(self.counts):
                for m in self.maps:
                    if self.mode == "bias":
                        shape: tuple[int, ...] = (table_heads, count)
                    elif letter == "v":
                        shape = (table_heads, count, self.head_dim)
                    else:
                        shape = (table_heads, self.head_dim, count)
                    tables[self.table_name(letter, s, m)] = nn.Parameter(torch.zeros(shape))
        return tables

    def table_name(self, letter: str, scale: int, map_name: str) -> str:
        """``k``, ``k_rows`` (cross), ``k_1`` (second scale), ``k_rows_1`` ..."""
        name = letter + (f"_{map_name}" if map_name else "")
        return name + (f"_{scale}" if len(self.scales) > 1 else "")

    @property
    def uses_value(self) -> bool:
        return "v" in self.on

    @property
    def content_free(self) -> bool:
        return self.mode == "bias"  # tables looked up by bucket, no q or k in them

    @property
    def toeplitz(self) -> bool:
        return self.mode == "bias"  # buckets of the 2D offset (and the prefix bucket)

    def extra_repr(self) -> str:
        ratios = ", ".join(f"{a:g}:{b:g}:{g:g}" for a, b, g in self.scales)
        extra = f", rescale=True (trained side {self.trained_side})" if self.rescale else ""
        extra += ", breakpoints=learned" if self.learned else ""
        return (
            f"method={self.method}, mode={self.mode}, on={self.on}, "
            f"shared_head={self.shared_head}, alpha:beta:gamma={ratios}, buckets={self.counts}"
            + extra
        )

    # --- bucket ids ---------------------------------------------------------------------------

    @property
    def learned(self) -> bool:
        return self.breakpoints == "learned"

    @property
    def soft(self) -> bool:
        """Interpolated reads while the learned breakpoints require gradients; hard when frozen."""
        return self.learned and (self.log_alpha.requires_grad or self.log_gamma.requires_grad)

    def learned_scales(self) -> list[tuple[Tensor, float, Tensor]]:
        """Every scale's ``(alpha, beta, gamma)`` with the learned alpha and gamma, float64
        scalars with their gradients."""
        out = []
        for s, (a0, beta, g0) in enumerate(self.scales):
            alpha = (a0 * self.log_alpha[s].double().exp()).clamp(max=beta)
            gamma = torch.maximum(g0 * self.log_gamma[s].double().exp(), alpha + MIN_GAP)
            out.append((alpha, beta, gamma))
        return out

    def grid_scales(self, reach: tuple[int, int]) -> list[Params]:
        """Every scale's ``(alpha, beta, gamma)`` on a grid whose offsets reach ``reach``: the
        learned breakpoints as they stand, and with ``rescale`` ``gamma`` stretched past the
        trained side (rule 2)."""
        scales = self.scales
        if self.learned:
            scales = [(a.item(), b, g.item()) for a, b, g in self.learned_scales()]
        if not self.rescale or self.trained_side is None:
            return scales
        s = adaptive.grid_stretch(reach, self.trained_side)
        return [(a, b, g * s) for a, b, g in scales]

    def _tables_for(self, reach: tuple[int, int], device: torch.device) -> list[Tensor]:
        """Offset -> id tables of every (scale, map), covering offsets up to ``reach``."""
        scales = self.grid_scales(reach)
        key = (reach, device, tuple(scales))  # learned breakpoints move: their values count
        if key not in self._offset_tables:
            tables: list[Tensor] = []
            for params in scales:
                made = bucket_table(self.method, reach[0] + 1, reach[1] + 1, *params)
                tables.extend(made if isinstance(made, tuple) else (made,))
            self._offset_tables[key] = tuple(t.to(device) for t in tables)
        return list(self._offset_tables[key])

    def soft_ids(
        self, offsets: Tensor, prefix: Tensor | None, reach: tuple[int, int]
    ) -> list[Pairs]:
        """Per scale, the ``(ids, weight)`` reads of ``(..., 2)`` offsets (query minus key)
        into its (cross: merged) table: the soft index of each axis (of the distance for
        euclidean and quant) between its two neighbouring buckets, the axes' reads combined
        with multiplied weights; prefix pairs (``prefix``) read the prefix bucket."""
        stretch = 1.0
        if self.rescale and self.trained_side is not None:
            stretch = adaptive.grid_stretch(reach, self.trained_side)
        dr, dc = offsets[..., 0], offsets[..., 1]
        out = []
        for (alpha, beta, gamma), count in zip(self.learned_scales(), self.counts, strict=True):
            params = (alpha, beta, gamma * stretch)
            if self.method == "euclidean":  # the distance rounded first, in float32
                reads = soft_reads((dr * dr + dc * dc).float().sqrt().round(), *params)
            elif self.method == "quant":
                reads = soft_reads(dr * dr + dc * dc, *params)
            else:  # product and cross index the same (rows, cols) grid of buckets
                side = count - 1 if self.method == "cross" else 2 * int(beta) + 1
                rows, cols = soft_reads(dr, *params), soft_reads(dc, *params)
                reads = [(r * side + c, wr * wc) for r, wr in rows for c, wc in cols]
            if prefix is not None:
                prefix_id = (count - 1) ** 2 if self.method == "cross" else count - 1
                reads = [(ids.masked_fill(prefix, prefix_id), w) for ids, w in reads]
            out.append(reads)
        return out

    def pairs(self, q_pos: Tensor, k_pos: Tensor) -> list[Pairs]:
        """Per scale, what every (query, key) pair reads: one id each (weight None), or the
        soft reads while the learned breakpoints require gradients."""
        if not self.soft:
            return [[(ids, None)] for ids in self.pair_bucket_ids(q_pos, k_pos)]
        offsets = q_pos[:, None, :] - k_pos[None, :, :]  # (Nq, Nk, 2), query minus key
        prefix = (q_pos[:, None, 0] < 0) | (k_pos[None, :, 0] < 0)  # (Nq, Nk)
        offsets = offsets.masked_fill(prefix[..., None], 0)
        return self.soft_ids(offsets, prefix, grid_reach(q_pos, k_pos))

    def slot_pairs(self, offsets: Tensor) -> list[Pairs]:
        """``pairs`` for window slots at ``(K, 2)`` offsets (query minus key)."""
        if not self.soft:
            return [[(ids, None)] for ids in self.slot_bucket_ids(offsets)]
        reach = offsets.abs().amax(dim=0).tolist() if len(offsets) else [0, 0]
        return self.soft_ids(offsets, None, (int(reach[0]), int(reach[1])))

    def _merge_maps(self, ids: list[Tensor]) -> list[Tensor]:
        """Per (scale, map) ids -> one id tensor per scale (cross: ``merged_cross_ids``)."""
        if self.method != "cross":
            return ids
        pairs = zip(ids[::2], ids[1::2], self.counts, strict=True)
        return [merged_cross_ids([rows, cols], count - 1) for rows, cols, count in pairs]

    def map_ids(self, q_pos: Tensor, k_pos: Tensor) -> list[Tensor]:
        """``(Nq, Nk)`` ids of every (scale, map) as the official code numbers them, uncached."""
        if q_pos.dim() != 2 or k_pos.dim() != 2 or q_pos.shape[-1] != 2:
            raise UsageError(
                "irpe: needs (row, col) grid positions (positions=grid_positions(h, w, prefix)); "
                "for sequences use shaw or t5"
            )
        tables = self._tables_for(grid_reach(q_pos, k_pos), q_pos.device)
        counts = [c for c in self.counts for _ in self.maps]  # per (scale, map)
        return [pair_ids(t, q_pos, k_pos, c - 1) for t, c in zip(tables, counts, strict=True)]

    def pair_bucket_ids(self, q_pos: Tensor, k_pos: Tensor) -> list[Tensor]:
        """``(Nq, Nk)`` ids into each scale's (cross: merged) table, cached by position values."""
        if self.learned:  # the ids move with the breakpoints: never cached
            return self._merge_maps(self.map_ids(q_pos, k_pos))
        key = (tuple(q_pos.shape), tuple(k_pos.shape), q_pos.dtype, q_pos.device)
        hit = self._pair_cache.get(key)
        if hit is not None and torch.equal(hit[0], q_pos) and torch.equal(hit[1], k_pos):
            return hit[2]
        ids = self._merge_maps(self.map_ids(q_pos, k_pos))
        self._pair_cache[key] = (q_pos.clone(), k_pos.clone(), ids)
        return ids

    def slot_bucket_ids(self, offsets: Tensor) -> list[Tensor]:
        """``(K,)`` ids into each scale's (cross: merged) table for window slots at ``offsets``
        ``(K, 2)``, query minus key."""
        key = (tuple(offsets.shape), offsets.dtype, offsets.device)
        hit = None if self.learned else self._slot_cache.get(key)
        if hit is not None and torch.equal(hit[0], offsets):
            return hit[1]
        reach = offsets.abs().amax(dim=0).tolist() if len(offsets) else [0, 0]
        tables = self._tables_for((int(reach[0]), int(reach[1])), offsets.device)
        ids = self._merge_maps([lookup_offsets(t, offsets) for t in tables])
        self._slot_cache[key] = (offsets.clone(), ids)
        return ids

    def buckets(self, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, int]:
        """The first scale's ids and bucket count; for cross its row ids (the column ids are the
        same function of the column offset)."""
        return self.map_ids(q_pos, k_pos)[0], self.counts[0]

    def _letter_tables(self, letter: str) -> list[Tensor]:
        """One table per scale for ``letter``; cross merges its rows and cols tables."""
        tables = [
            [self.tables[self.table_name(letter, s, m)] for m in self.maps]
            for s in range(len(self.scales))
        ]
        if self.method != "cross":
            return [t[0] for t in tables]
        axis = -2 if letter == "v" and self.mode == "contextual" else -1  # the bucket axis
        return [merged_cross_table([rows, cols], axis) for rows, cols in tables]

    def _per_bucket(self, x: Tensor, table: Tensor) -> Tensor:
        """``x . r_b`` for every bucket: ``(B, H, N, d)`` by ``(H|1, d, nb)`` -> ``(B, H, N, nb)``,
        already scaled by ``1/sqrt(d)`` (the official scales q, or k, before this product)."""
        weight = table[0] if table.shape[0] == 1 else table  # (d, nb): one GEMM for all heads
        return x @ (weight * self.logit_scale())

    # --- hooks --------------------------------------------------------------------------------

    def bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        terms: list[Tensor] = []
        bias_mode = self.mode == "bias"
        if "k" in self.on:
            for table, reads in zip(
                self._letter_tables("k"), self.pairs(q_pos, k_pos), strict=True
            ):
                per_bucket = None if bias_mode else self._per_bucket(q, table)  # (B, H, Nq, nb)
                for idx, w in reads:
                    if per_bucket is None:
                        term = table_bias(table, idx)  # (1, H|1, Nq, Nk)
                    else:
                        term = gather_buckets(per_bucket, idx)  # (B, H, Nq, Nk)
                    terms.append(term if w is None else term * w.to(term.dtype))
        if "q" in self.on:
            # b(j, i), key minus query: ids (Nk, Nq)
            for table, reads in zip(
                self._letter_tables("q"), self.pairs(k_pos, q_pos), strict=True
            ):
                per_key = None if bias_mode else self._per_bucket(k, table)  # (B, H, Nk, nb)
                for idx, w in reads:
                    if per_key is None:
                        term = table_bias(table, idx.T)  # (1, H|1, Nq, Nk)
                    else:
                        term = bucket_attention.column_term(per_key, idx)  # (B, H, Nq, Nk)
                    terms.append(term if w is None else term * w.T.to(term.dtype))
        if not terms:
            return None
        total = terms[0]
        for term in terms[1:]:
            total = total + term
        return total

    def attend(self, q, k, v, q_pos, k_pos, scale, causal, key_mask=None) -> Tensor | None:
        """Contextual terms on the explicit path with a hand-written backward
        (``kernels/bucket_attention.py``), up to the size where the explicit path pays; bias
        mode, soft reads, and larger inputs without a value term, take the attention module's
        paths."""
        small = q.shape[-2] * k.shape[-2] <= EXPLICIT_MAX_PAIRS
        if key_mask is not None or self.mode != "contextual" or causal or self.soft:
            return None
        if not (small or self.uses_value):
            return None
        ids = self.pair_bucket_ids(q_pos, k_pos) if "k" in self.on or "v" in self.on else []
        rows = cols = values = []
        if "k" in self.on:
            tables = self._letter_tables("k")
            rows = [(self._per_bucket(q, t), i) for t, i in zip(tables, ids, strict=True)]
        if "q" in self.on:
            ids_t = self.pair_bucket_ids(k_pos, q_pos)  # b(j, i): key minus query
            tables = self._letter_tables("q")
            cols = [(self._per_bucket(k, t), i) for t, i in zip(tables, ids_t, strict=True)]
        if "v" in self.on:
            values = list(zip(self._letter_tables("v"), ids, strict=True))
        return bucket_attention.bucket_attention(q, k, v, scale, rows, cols, values)

    def value(self, attn: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        if "v" not in self.on:
            return None
        out = None
        for table, reads in zip(self._letter_tables("v"), self.pairs(q_pos, k_pos), strict=True):
            weight = None  # (B, H, Nq, nb): attention summed per bucket, split by the reads
            for idx, w in reads:
                split = attn if w is None else attn * w.to(attn.dtype)
                part = sum_per_bucket(split, idx, table.shape[-2])
                weight = part if weight is None else weight + part
            assert weight is not None
            term = weight @ (table[0] if table.shape[0] == 1 else table)  # (B, H, Nq, d)
            out = term if out is None else out + term
        return out

    def window_bias(self, q: Tensor, k: Tensor, offsets: Tensor, keys: Tensor) -> Tensor | None:
        terms: list[Tensor] = []
        if "k" in self.on:
            for table, reads in zip(
                self._letter_tables("k"), self.slot_pairs(offsets), strict=True
            ):
                per_bucket = None if self.mode == "bias" else self._per_bucket(q, table)
                for idx, w in reads:
                    if per_bucket is None:
                        term = table[:, idx][None, :, None]  # (1, H|1, 1, K)
                    else:
                        term = per_bucket.index_select(-1, idx)  # (B, H, Nq, K)
                    terms.append(term if w is None else term * w.to(term.dtype))
        if "q" in self.on:
            # key minus query
            for table, reads in zip(
                self._letter_tables("q"), self.slot_pairs(-offsets), strict=True
            ):
                for idx, w in reads:
                    if self.mode == "bias":
                        term = table[:, idx][None, :, None]  # (1, H|1, 1, K)
                    else:  # k_j . r^Q[b(slot)] for the key j of every query's slot
                        per_key = self._per_bucket(k, table).index_select(-1, idx)  # (B,H,N,K)
                        padded = F.pad(per_key, (0, 0, 0, 1))  # off-grid slots read row N
                        index = keys.expand(*per_key.shape[:2], *keys.shape)
                        term = padded.gather(2, index)  # (B, H, N, K)
                    terms.append(term if w is None else term * w.to(term.dtype))
        if not terms:
            return None
        total = terms[0]
        for term in terms[1:]:
            total = total + term
        return total

    def window_value(self, attn: Tensor, offsets: Tensor) -> Tensor | None:
        if "v" not in self.on:
            return None
        out = None
        for table, reads in zip(self._letter_tables("v"), self.slot_pairs(offsets), strict=True):
            for idx, w in reads:
                slots = table[:, idx]  # (H|1, K, d)
                weights = attn if w is None else attn * w.to(attn.dtype)
                term = weights @ (slots[0] if slots.shape[0] == 1 else slots)  # (B, H, Nq, d)
                out = term if out is None else out + term
        return out


__all__ = [
    "ImageRPE",
    "bucket_ids",
    "bucket_table",
    "grid_reach",
    "index_scales",
    "lookup_offsets",
    "num_buckets",
    "pair_ids",
    "piecewise_index",
]

"""He, Liu, Gao, Chen 2021, "DeBERTa: Decoding-enhanced BERT with Disentangled Attention"
(ICLR 2021), with the log-bucket relative positions of DeBERTa-v2/v3.

The disentangled score (paper eq. 4, per head of size d, relative table P of 2k rows):

    A_ij = Q^c_i . K^c_j  +  Q^c_i . K^r_{delta(i,j)}  +  K^c_j . Q^r_{delta(j,i)}
           content          content-to-position (c2p)    position-to-content (p2c)
    H_o  = softmax(A / sqrt(3d)) V^c,     K^r = P W_{k,r},  Q^r = P W_{q,r}

    delta(i, j) = 0            if i - j <= -k
                  2k - 1       if i - j >= k
                  i - j + k    otherwise            (paper eq. 2: query minus key, offset by k)

Signs and indices, exactly as the paper writes them:
- ``deberta_relative_positions(q_pos, k_pos)`` is ``pos_i - pos_j`` (query minus key), the sign
  the reference code builds (``q_ids[:, None] - k_ids[None, :]``). This is the opposite of
  Shaw/T5 (key minus query).
- c2p of pair (i, j) reads row ``delta(i, j)`` of K^r: ``q_i . K^r[clip(pos_i - pos_j)]``.
- p2c of pair (i, j) reads row ``delta(j, i)`` of Q^r: ``k_j . Q^r[clip(pos_j - pos_i)]``
  ("the key content at j w.r.t. the query's position i", paper section 3.1).
- With ``position_buckets > 0`` (v2/v3) ``pos_i - pos_j`` is first mapped by
  ``log_bucket_positions`` and the table has ``2 * position_buckets`` rows (k = position_buckets);
  with ``position_buckets = 0`` (v1) the distance is only clipped and k = max_relative_positions.
- The logit scale is ``1 / sqrt(d * (1 + c2p + p2c))``, the paper's 1/sqrt(3d) with both terms,
  and it applies to the content term and to both position terms alike.

Deviations from the paper and the reference code (microsoft/DeBERTa, HF transformers):
- Every layer owns its relative table and its two projections. DeBERTa shares one table across
  all layers, and v2/v3 (``share_att_key``) project it with the layer's own W_k and W_q; this
  encoding cannot see the layer's weights, so it keeps v1-style separate projections: W_{k,r}
  without bias (a bias on it adds ``q_i . b`` to a whole row, which softmax cancels) and
  W_{q,r} with bias (``k_j . b`` is a per-key term that does not cancel), as v1 has them.
- The reference code indexes p2c with delta(i, j), the same row as c2p, not the paper's
  delta(j, i): HF gathers ``k @ Q^r.T`` with ``clamp(-r_pos + k)`` and then transposes, and the
  official code reuses the c2p index (see microsoft/DeBERTa issue 162). This file follows the
  paper; a checkpoint trained with the reference code would need the other sign.
- No LayerNorm or dropout on the relative table (v2/v3 ``norm_rel_ebd``); the table is
  initialised with unit variance, the scale a LayerNorm would give it, so position terms start
  at the size of content terms. No p2p term, no absolute input embedding, no enhanced mask
  decoder: positions reach the model only through this attention bias.
- The log bucket is computed in float64 (the reference uses float32); the two agree except for
  float32 rounding at exact ``ceil`` boundaries.
- Keys longer than queries (memory, cache) use the true positions of both sides; the reference
  rebuilds a key-by-key matrix for p2c instead.

Efficiency: ``q @ K^r.T`` is computed once per table row some pair reads (the rows between
those of the extreme distances: 127 of v2's 512 at 64 tokens), ``(B, H, Nq, rows)``, and gathered
by index; p2c likewise from ``k @ Q^r.T``, ``(B, H, Nk, rows)``, gathered straight into the
queries' layout (``gather_by_key``; gathered by key, its sum with c2p was a strided add), or,
where the rows outnumber the keys, each pair's row picked first (``table_products``). No
batch-sized ``(B, Nq, Nk, d)`` tensor is built. Asked block by block (``bias_by_block``), both
products are made once per call and each block gathers from its rows and keys of them, and
scatters its gradient back into theirs by hand. Under a causal mask (``visible_bias``, and
``bias_by_block`` with ``causal``) the products cover only the half of the table that pairs
with the key at or before the query read.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from posenc_cli.encodings.base import PositionEncoding
from posenc_cli.errors import UsageError
from posenc_cli.kernels.buckets import (
    gather_buckets,
    gather_by_key,
    scatter_add_by_key,
    table_products,
)


def log_bucket_positions(
    relative: Tensor, position_buckets: int, max_relative_positions: int
) -> Tensor:
    """DeBERTa-v2 log buckets of signed distances (any shape, long in, long out).

    With ``mid = position_buckets // 2``: ``b(x) = x`` for ``|x| <= mid``, else
    ``sign(x) * (mid + ceil(ln(|x| / mid) / ln((max_relative_positions - 1) / mid) * (mid - 1)))``
    so ``|x| = max_relative_positions - 1`` lands on ``2 mid - 1``; farther ones grow past it and
    are clipped by ``relative_index``.
    """
    mid = position_buckets // 2
    size = relative.abs()
    far = size.clamp(min=mid).double()  # the log branch is only used where |x| > mid
    ratio = math.log((max_relative_positions - 1) / mid)
    log_pos = torch.ceil(torch.log(far / mid) / ratio * (mid - 1)).long() + mid
    return torch.where(size <= mid, relative, relative.sign() * log_pos)


def deberta_relative_positions(
    q_pos: Tensor, k_pos: Tensor, position_buckets: int, max_relative_positions: int
) -> Tensor:
    """``pos_i - pos_j`` (query minus key, DeBERTa's sign), log-bucketed when
    ``position_buckets > 0``: ``(Nq, Nk)`` long. Swap the arguments for delta(j, i)."""
    rel = q_pos[:, None] - k_pos[None, :]  # (Nq, Nk)
    if position_buckets > 0:
        rel = log_bucket_positions(rel, position_buckets, max_relative_positions)
    return rel


def relative_index(rel: Tensor, span: int) -> Tensor:
    """The paper's delta: ``clip(rel + k, 0, 2k - 1)`` with ``k = span``, a row of the table."""
    return (rel + span).clamp(0, 2 * span - 1)


def both_terms(c2p: Tensor | None, p2c: Tensor | None) -> Tensor:
    """c2p + p2c of every pair, ``(B, H, Nq, Nk)``, from the terms that are on. Both are fresh
    tensors, so c2p takes p2c in place."""
    if c2p is None or p2c is None:
        return p2c if c2p is None else c2p
    return c2p.add_(p2c)


class DebertaDisentangled(PositionEncoding):
    """Disentangled attention: content-to-position and position-to-content logit terms."""

    pairwise_content = True  # the (i, j) logit term reads q_i, k_j and positions only
    family = "relative"
    per_layer = True

    def __init__(
        self,
        *,
        position_buckets: int = 256,
        max_relative_positions: int = 512,
        c2p: bool = True,
        p2c: bool = True,
        dim: int = 512,
        heads: int = 8,
        head_dim: int = 64,
        causal: bool = False,
    ) -> None:
        super().__init__(heads=heads, head_dim=head_dim, causal=causal)
        if position_buckets < 0 or position_buckets == 1:
            raise UsageError(
                f"deberta.position_buckets must be 0 (plain clipping, DeBERTa v1) or >= 2, "
                f"got {position_buckets}"
            )
        if position_buckets > 0 and max_relative_positions <= position_buckets // 2 + 1:
            raise UsageError(
                f"deberta.max_relative_positions must exceed position_buckets // 2 + 1 = "
                f"{position_buckets // 2 + 1}, got {max_relative_positions}"
            )
        if max_relative_positions < 1:
            raise UsageError(
                f"deberta.max_relative_positions must be >= 1, got {max_relative_positions}"
            )
        if not (c2p or p2c):
            raise UsageError(
                "deberta: c2p and p2c are both false; set one true or use encoding 'none'"
            )
        self.position_buckets = position_buckets
        self.max_relative_positions = max_relative_positions
        self.c2p = c2p
        self.p2c = p2c
        self.span = position_buckets if position_buckets > 0 else max_relative_positions
        inner = heads * head_dim
        self.rel_embeddings = nn.Parameter(torch.randn(2 * self.span, dim))  # (2k, D)
        self.pos_key = nn.Linear(dim, inner, bias=False) if c2p else None
        self.pos_query = nn.Linear(dim, inner) if p2c else None

    def logit_scale(self) -> float:
        return (self.head_dim * (1 + self.c2p + self.p2c)) ** -0.5

    def per_head(self, proj: nn.Linear) -> Tensor:
        """The projected table per head, laid out for a batched matmul: ``(H, d, 2k)``."""
        table = proj(self.rel_embeddings).view(2 * self.span, self.heads, self.head_dim)
        return table.permute(1, 2, 0)  # (H, d, 2k)

    def relative(self, a_pos: Tensor, b_pos: Tensor) -> Tensor:
        """delta(a, b) for every pair: table rows ``(Na, Nb)``. A function of ``pos_a - pos_b``
        alone, so the log bucket (float64 log and ceil) runs once per distinct difference and
        each pair looks its difference up: per pair it took 150 ms at 2048 x 2048. Positions
        spread wider than there are pairs (sparse ones) take the per-pair formula."""
        low, high = int(a_pos.min() - b_pos.max()), int(a_pos.max() - b_pos.min())
        if high - low + 1 > a_pos.numel() * b_pos.numel():
            return self.rows_of(a_pos, b_pos)
        differences = torch.arange(low, high + 1, device=a_pos.device)
        per_difference = self.rows_of(differences, differences.new_zeros(1))[:, 0]  # (n,)
        return per_difference[(a_pos - low)[:, None] - b_pos[None, :]]  # low off the short side

    def rows_of(self, a_pos: Tensor, b_pos: Tensor) -> Tensor:
        """delta(a, b) by the paper's formula, pair by pair."""
        rel = deberta_relative_positions(
            a_pos, b_pos, self.position_buckets, self.max_relative_positions
        )
        return relative_index(rel, self.span)

    def buckets(self, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, int]:
        """The c2p row delta(i, j) of every pair (p2c reads delta(j, i), the transpose)."""
        return self.relative(q_pos, k_pos), 2 * self.span

    def bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        return self.visible_bias(q, k, q_pos, k_pos, causal=False)

    def visible_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, causal: bool):
        """Under a causal mask from the half of the table visible pairs read (``window``). With
        positions spread over 256 (randomized) every pair's window is the whole table: a causal
        training step of copy-randomized took 63.9 ms with both halves and 48.9 with one (A/B in
        one process), and 44.3 with each term through ``table_products``, which picks each
        pair's row first where rows outnumber keys."""
        (c2p_window, p2c_window), scale = self.windows(q_pos, k_pos, causal), self.logit_scale()
        c2p = p2c = None
        if self.pos_key is not None:
            c2p = self.term(q * scale, self.pos_key, c2p_window, q_pos, k_pos)
        if self.pos_query is not None:
            p2c = self.term(k * scale, self.pos_query, p2c_window, k_pos, q_pos, transposed=True)
        return both_terms(c2p, p2c)

    def term(
        self, x: Tensor, proj: nn.Linear, window: tuple[int, int], a_pos, b_pos, transposed=False
    ) -> Tensor:
        """``x_a`` times the projected table row ``delta(a, b)`` reads, for every pair of ``a``
        (the queries for c2p, the keys for p2c) and ``b``, ``(B, H, Na, Nb)``, or with
        ``transposed`` ``(B, H, Nb, Na)`` (p2c, by query; see ``table_products``)."""
        first, last = window
        rows = self.per_head(proj)[..., first : last + 1].transpose(-2, -1)  # (H, w, d)
        return table_products(x, rows, self.rows_read(a_pos, b_pos, window), transposed)

    def window(self, a_pos: Tensor, b_pos: Tensor, c2p: bool, causal: bool) -> tuple[int, int]:
        """The first and last table row a pair of ``a_pos`` and ``b_pos`` can read (``a`` the
        queries for c2p, the keys for p2c). delta grows with ``pos_a - pos_b``, so the rows of
        the two extreme differences bound every pair's: 64 tokens read 127 of DeBERTa-v2's 512
        rows. Under a causal mask a visible pair has ``i - j >= 0`` and reads c2p rows k..2k-1,
        p2c rows 0..k; a hidden pair is clamped into the window, read, and masked."""
        ends = torch.stack([a_pos.min() - b_pos.max(), a_pos.max() - b_pos.min()])
        first, last = self.rows_of(ends, ends.new_zeros(1))[:, 0].tolist()
        if causal and c2p:
            first = max(first, self.span)
        elif causal:
            last = min(last, self.span)
        return first, max(first, last)

    def windows(self, q_pos: Tensor, k_pos: Tensor, causal: bool) -> tuple[tuple[int, int], ...]:
        """The c2p and p2c windows of these queries and keys."""
        return self.window(q_pos, k_pos, True, causal), self.window(k_pos, q_pos, False, causal)

    def per_bucket(
        self, q: Tensor, k: Tensor, windows: tuple[tuple[int, int], ...]
    ) -> tuple[Tensor | None, Tensor | None]:
        """``q @ K^r`` ``(B, H, Nq, w)`` and ``k @ Q^r`` ``(B, H, Nk, w')`` over the table rows of
        each term's window, times the logit scale (on q and k, cheaper than on the products):
        every query's c2p and every key's p2c score at each row a pair can read (None for a term
        that is off)."""
        scale = self.logit_scale()
        (c_first, c_last), (p_first, p_last) = windows
        c2p = p2c = None
        if self.pos_key is not None:
            table = self.per_head(self.pos_key)  # (H, d, 2k)
            c2p = (q * scale) @ table[..., c_first : c_last + 1]
        if self.pos_query is not None:
            table = self.per_head(self.pos_query)
            p2c = (k * scale) @ table[..., p_first : p_last + 1]
        return c2p, p2c

    def rows_read(self, a_pos: Tensor, b_pos: Tensor, window: tuple[int, int]) -> Tensor:
        """Which column of ``per_bucket``'s c2p (``a`` the queries) or p2c scores (``a`` the
        keys) each pair reads, ``(Na, Nb)``: its table row, clamped into ``window`` (only a
        hidden pair of a causal window lies outside it) and counted from the window's start."""
        first, last = window
        return self.relative(a_pos, b_pos).clamp(first, last) - first

    def gathered(self, c2p_rows, p2c_rows, q_pos: Tensor, k_pos: Tensor, windows) -> Tensor:
        """c2p + p2c of every pair (the scores already scaled), a new tensor: each pair's table
        row picked from the scores."""
        c2p = p2c = None
        if c2p_rows is not None:
            c2p = gather_buckets(c2p_rows, self.rows_read(q_pos, k_pos, windows[0]))
        if p2c_rows is not None:
            p2c = gather_by_key(p2c_rows, self.rows_read(k_pos, q_pos, windows[1]).T)
        return both_terms(c2p, p2c)

    def bias_by_block(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, causal=False):
        """The scores per table row once for all queries and keys (per block, a causal block of
        rows ending at key e multiplied all e keys by Q^r again, and both tables were projected
        again, forward and backward): each block gathers from its rows and keys of them. Under a
        causal mask, of only the half of the table visible pairs read."""
        windows = self.windows(q_pos, k_pos, causal)
        c2p_rows, p2c_rows = self.per_bucket(q, k, windows)
        # a term that is off reads nothing; q or k stands in for it, unread
        reads = (q if c2p_rows is None else c2p_rows, k if p2c_rows is None else p2c_rows)
        on = (c2p_rows is not None, p2c_rows is not None)

        def block(rows: Tensor, keys: Tensor, q_pos_b: Tensor, k_pos_b: Tensor) -> Tensor:
            c2p, p2c = (rows if on[0] else None), (keys if on[1] else None)
            return self.gathered(c2p, p2c, q_pos_b, k_pos_b, windows)

        def add_grads(d_bias: Tensor, _rows, _keys, q_pos_b, k_pos_b, d_rows, d_keys) -> list:
            # a gather's gradient is a scatter-add; made here straight into the kernel's
            # buffers, autograd would zero a (B, H, rows, 2k) tensor per term and tile first
            if on[0]:
                rows = self.rows_read(q_pos_b, k_pos_b, windows[0]).expand(d_bias.shape)
                d_rows.scatter_add_(-1, rows, d_bias)
            if on[1]:
                scatter_add_by_key(d_keys, self.rows_read(k_pos_b, q_pos_b, windows[1]).T, d_bias)
            return []  # no leaves: the tables reach autograd through the two products

        block.tiles_freely = True  # a gather per pair: the kernel may cut a block's keys in tiles
        block.add_grads = add_grads
        block.fresh = True  # a new tensor per call: the kernel may fold the mask in in place
        return block, [], reads

    def extra_repr(self) -> str:
        return (
            f"position_buckets={self.position_buckets}, "
            f"max_relative_positions={self.max_relative_positions}, "
            f"c2p={self.c2p}, p2c={self.p2c}, span={self.span}"
        )

"""Attention with clipped relative terms on the flash kernel, CPU, forward and backward.

Shaw et al.'s key and value terms look up a table row by ``clip(j - i, -K, K)``. For a block of
queries ``i in [s, e)`` the keys fall in three regions:

- far left, ``j < s - K``: every pair is in the first bucket, so the key term is one number per
  query, ``q_i . w^K[0]``, and the value term the one vector ``w^V[0]``;
- far right, ``j > e - 1 + K``: the same with the last bucket;
- near, the ``c + 2K`` keys in between, where the buckets vary (``c + K`` under a causal mask,
  where the K keys past the block's last query are all in the future).

A per-query constant added to a region's logits only shifts that region's logsumexp, so the far
regions are plain attention: the flash kernel gives their output and logsumexp, the constant is
added to the logsumexp, and the regions are merged by their logsumexps (the flash-decoding
merge). The near region is small and computed explicitly. The value term of a far region is its
softmax mass times the one table row. No (N, N) tensor exists in either pass.

The far regions of all blocks together form a staircase. It is cut into rectangles recursively
(the rows of the upper half of the blocks take the keys that all of them share, then each half
again), so most pairs go through a few kernel calls with hundreds of query rows: with 128 rows a
call measured 1.35x the time per pair of one with 1024.

Backward: the flash backward takes ``out`` and ``lse`` as given and forms
``dS = P * (dO v^T - rowsum(dO * out))`` with ``P = exp(q k^T * scale - lse)``. Giving it the total
logsumexp minus the region's constant (the true probabilities) and ``out - w^V[b]`` (so that the
row sum carries the value term) makes its dq, dk, dv exactly the rectangle's share of the true
gradient. The key-term and table gradients of a far region are one number per query,
``sum_j dS_ij = mass * dO . (o_region + w^V[b] - out)``.

T5's buckets also stop changing past a distance (91 with the default 32 buckets and
``max_distance`` 128): the same kernel takes its per-head bias table in place of Shaw's key term
(``saturating_bias_attention``), with the buckets of the band read from T5's lookup table.

Positions must be consecutive (``k_pos = arange(start, start + Nk)``, queries the last ``Nq``),
with no key mask and no dropout; ``applies`` checks the first, the attention module the rest.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from posenc_cli.kernels.biased_sdpa import probabilities_, reduce_to
from posenc_cli.kernels.buckets import gather_buckets, sum_per_bucket
from posenc_cli.kernels.positions import consecutive
from posenc_cli.kernels.scratch import Scratch

BLOCK = 128  # query rows per block: the near region is BLOCK x (BLOCK + 2K)
# Up to this many (query, key) pairs Shaw's explicit softmax path is faster: with B=4, H=8,
# d=64 and k=4 (benchmarks/attention_overhead.py shape, one layer) it measured 1.34x of no
# encoding against 1.41x here at N=256, and 1.55x against 1.44x at N=384.
MIN_PAIRS = 256 * 256
# T5: the near band is BLOCK + 2K keys wide (K = 91 by default), so the kernel pays only from
# several times K keys on: at N=512 it measured 1.27x of no encoding against 1.35x for
# biased_sdpa, at N=256 1.28x against 1.16x.
SATURATED_MIN_KEYS = 5

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def applies(q: Tensor, k_pos: Tensor) -> bool:
    """Whether the kernel can run: the CPU flash kernel in float32/64, over consecutive 1D
    positions (the regions are ranges of key indices)."""
    return (
        q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64) and consecutive(k_pos)
    )


def saturated_core(lookup: Tensor) -> Tensor:
    """The shortest centred part of a bucket ``lookup`` over relative positions ``-K..K`` past
    whose ends the bucket no longer changes: the same buckets with the smallest near band."""
    clip = (len(lookup) - 1) // 2
    keep = clip
    while (
        keep > 0 and lookup[clip - keep + 1] == lookup[0] and lookup[clip + keep - 1] == lookup[-1]
    ):
        keep -= 1
    return lookup[clip - keep : clip + keep + 1]


class Block:
    """The near keys of query rows ``[s, e)`` (key index ``i + offset``), clip distance K;
    ``lookup[r + K]`` is the bucket of relative position r in -K..K."""

    def __init__(self, s: int, e: int, offset: int, keys: int, causal: bool, lookup: Tensor):
        clip, device = (len(lookup) - 1) // 2, lookup.device
        self.rows = slice(s, e)
        left = min(max(s + offset - clip, 0), keys)  # far left: keys [0, left)
        # far right: keys [right, keys); under a causal mask the near band ends at the block's
        # last query, since the clip distance past it holds only future keys
        right = min(max(e + offset + (0 if causal else clip), left), keys)
        self.near = slice(left, right)
        query = torch.arange(s, e, device=device)[:, None] + offset  # (c, 1)
        rel = torch.arange(left, right, device=device)[None, :] - query  # (c, w)
        self.ids = lookup[rel.clamp(-clip, clip) + clip]  # (c, w) bucket of every near pair
        self.allowed = rel <= 0 if causal else None  # (c, w) or None


class Layout:
    """Every block's near keys, and the far keys of both sides cut into rectangles
    ``(rows, keys)``; a causal mask leaves no far right (those keys are all in the future)."""

    def __init__(self, n: int, keys: int, causal: bool, lookup: Tensor):
        offset = keys - n
        self.blocks = [
            Block(s, min(n, s + BLOCK), offset, keys, causal, lookup) for s in range(0, n, BLOCK)
        ]
        self.n = n
        lefts = [b.near.start for b in self.blocks]
        rights = [b.near.stop for b in self.blocks]
        count = len(self.blocks)
        left = [(rows, slice(a, b)) for rows, a, b in self._left(lefts, 0, count, 0) if b > a]
        right = (
            []
            if causal
            else [
                (rows, slice(a, b)) for rows, a, b in self._right(rights, 0, count, keys) if b > a
            ]
        )
        self.far = (left, right)

    def _rows(self, lo: int, hi: int) -> slice:
        return slice(lo * BLOCK, min(hi * BLOCK, self.n))

    def _left(self, bounds, lo, hi, start) -> Iterator[tuple[slice, int, int]]:
        """Blocks ``[lo, hi)`` need keys ``[start, bounds[b])``, bounds non-decreasing."""
        if hi - lo == 1:
            yield self._rows(lo, hi), start, bounds[lo]
            return
        mid = (lo + hi) // 2
        yield self._rows(mid, hi), start, bounds[mid]  # shared by every block from mid on
        yield from self._left(bounds, lo, mid, start)
        yield from self._left(bounds, mid, hi, bounds[mid])

    def _right(self, bounds, lo, hi, stop) -> Iterator[tuple[slice, int, int]]:
        """Blocks ``[lo, hi)`` need keys ``[bounds[b], stop)``, bounds non-decreasing."""
        if hi - lo == 1:
            yield self._rows(lo, hi), bounds[lo], stop
            return
        mid = (lo + hi) // 2
        yield self._rows(lo, mid), bounds[mid - 1], stop  # shared by every block before mid
        yield from self._right(bounds, lo, mid, bounds[mid - 1])
        yield from self._right(bounds, mid, hi, stop)


def merge(parts: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """Outputs ``(B, H, N, d)`` with logsumexps ``(B, H, N)`` of disjoint key regions -> the
    output and logsumexp of attention over their union (the first output is overwritten)."""
    lse = torch.logsumexp(torch.stack([lse for _, lse in parts]), dim=0)
    (out, first_lse), rest = parts[0], parts[1:]
    out = out.mul_((first_lse - lse).exp()[..., None])
    for part, part_lse in rest:
        out.addcmul_(part, (part_lse - lse).exp()[..., None])
    return out, lse


def _accumulate(out: Tensor, lse: Tensor, rows: slice, part: Tensor, part_lse: Tensor) -> None:
    """Merge one rectangle's output and logsumexp into the running ones of its rows (``out``'s
    rows are updated in place by ``merge``)."""
    lse[:, :, rows] = merge([(out[:, :, rows], lse[:, :, rows]), (part, part_lse)])[1]


class _ClippedRelativeAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, key_table, bias_table, value_table, lookup, scale, key_scale, causal):
        B, H, N, d = q.shape
        # once here rather than a copy of every block's slice in each matmul
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        layout = Layout(N, k.shape[-2], causal, lookup)
        buckets = _buckets(key_table, bias_table, value_table)
        term = _term(q, key_table, bias_table, key_scale)
        scaled = q * scale
        near, near_lse = _heads_last(q.new_empty(B, N, H, d)), q.new_empty(B, H, N)
        scratch = Scratch(q)
        for blk in layout.blocks:
            near[:, :, blk.rows], near_lse[:, :, blk.rows] = _near_forward(
                blk, scaled, k, v, term, value_table, buckets, scratch
            )
        # each far side's own output and logsumexp (without its constant), kept for backward
        far = q.new_zeros(2, B, H, N, d)
        far_lse = q.new_full((2, B, H, N), float("-inf"))
        parts = [(near, near_lse)]
        for (side, bucket), rectangles in zip(_ends(lookup), layout.far, strict=True):
            for rows, keys in rectangles:
                o, o_lse = _flash(q[:, :, rows], k[:, :, keys], v[:, :, keys], scale=scale)
                _accumulate(far[side], far_lse[side], rows, o, o_lse)
            if rectangles:
                part = far[side] if value_table is None else far[side] + value_table[bucket]
                parts.append((part, far_lse[side] + _shift(term, bucket)))
        out, lse = merge(parts)
        ctx.save_for_backward(
            q, scaled, k, v, key_table, bias_table, value_table, lookup, out, lse
        )  # fmt: skip
        ctx.far, ctx.layout, ctx.term = (far, far_lse), layout, term  # not rebuilt in backward
        ctx.args = (scale, key_scale)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, scaled, k, v, key_table, bias_table, value_table, lookup, out, lse = ctx.saved_tensors
        far, far_lse = ctx.far
        layout, term = ctx.layout, ctx.term
        scale, key_scale = ctx.args
        buckets = _buckets(key_table, bias_table, value_table)
        grads = Grads(q, k, term, value_table, buckets, Scratch(q))
        row_dot = torch.linalg.vecdot(grad_out, out)  # (B, H, N)
        for blk in layout.blocks:
            _near_backward(
                blk, scaled, k, v, grad_out, lse, row_dot, term, value_table, scale, grads
            )
        for (side, bucket), rectangles in zip(_ends(lookup), layout.far, strict=True):
            if not rectangles:
                continue
            row = value_table[bucket] if value_table is not None else None
            shift = _shift(term, bucket)
            # what makes the kernel's dS the true one
            out_row = out if row is None else out - row
            lse_row = lse if term is None else lse - shift
            for rows, keys in rectangles:
                g_q, g_k, g_v = _flash_backward(
                    grad_out[:, :, rows], q[:, :, rows], k[:, :, keys], v[:, :, keys],
                    out_row[:, :, rows], lse_row[:, :, rows], 0.0, False, scale=scale,
                )  # fmt: skip
                grads.dq[:, :, rows].add_(g_q)
                grads.dk[:, :, keys].add_(g_k)
                grads.dv[:, :, keys].add_(g_v)
            weight = (far_lse[side] + shift - lse).exp()  # (B, H, N) softmax mass of the side
            if grads.term is not None:
                o_row = far[side] if row is None else far[side] + row
                d_logit = weight * (torch.linalg.vecdot(grad_out, o_row) - row_dot)
                grads.term[..., bucket] += reduce_to(d_logit, grads.term.shape[:-1])
            if grads.mass is not None:
                grads.mass[..., bucket] += weight
        return (
            *grads.result(q, grad_out, key_table, bias_table, key_scale),
            None,
            None,
            None,
            None,
        )


class Grads:
    """Gradient accumulators: dq, dk, dv, the logit term per bucket (shaped like the term, so
    T5's per-head bias sums over batch and rows as it goes) and the softmax mass per bucket."""

    def __init__(self, q, k, term: Tensor | None, value_table, buckets: int, scratch: Scratch):
        self.scratch = scratch
        B, H, N, d = q.shape
        Nk = k.shape[-2]
        self.dq = _heads_last(q.new_zeros(B, N, H, d))
        self.dk, self.dv = (_heads_last(k.new_zeros(B, Nk, H, d)) for _ in range(2))
        self.term = torch.zeros_like(term) if term is not None else None
        self.mass = q.new_zeros(*q.shape[:-1], buckets) if value_table is not None else None

    def add_term(self, rows: slice, per_bucket: Tensor) -> None:
        if self.term.shape[2] == 1:
            self.term += per_bucket.sum(2, keepdim=True)
        else:
            self.term[:, :, rows] += per_bucket

    def result(self, q, grad_out, key_table, bias_table, key_scale):
        d_key_table = d_bias_table = d_value_table = None
        if bias_table is not None:
            d_bias_table = self.term.sum(dim=(0, 2))  # (H, nb)
        if key_table is not None:
            buckets = key_table.shape[0]
            self.dq += self.term @ key_table * key_scale
            flat = self.term.reshape(-1, buckets).T
            d_key_table = flat @ q.reshape(-1, q.shape[-1]) * key_scale
        if self.mass is not None:
            flat = self.mass.reshape(-1, self.mass.shape[-1]).T
            d_value_table = flat @ grad_out.reshape(-1, grad_out.shape[-1])
        return self.dq, self.dk, self.dv, d_key_table, d_bias_table, d_value_table


def _heads_last(t: Tensor) -> Tensor:
    """A ``(B, N, H, d)`` tensor seen as ``(B, H, N, d)``: the layout the attention module's head
    split and merge read without a copy (as SDPA's own outputs and gradients are laid out)."""
    return t.transpose(1, 2)


def _buckets(key_table, bias_table, value_table) -> int:
    if key_table is not None:
        return key_table.shape[0]
    return bias_table.shape[1] if bias_table is not None else value_table.shape[0]


def _ends(lookup: Tensor) -> tuple[tuple[int, int], tuple[int, int]]:
    """(side, bucket) of the far left and the far right: every key there is in that bucket."""
    return (0, int(lookup[0])), (1, int(lookup[-1]))


def _term(q, key_table, bias_table, key_scale: float) -> Tensor | None:
    """Each query's logit term for every bucket: ``q . w^K[b] * key_scale`` (Shaw,
    ``(B, H, N, nb)``) plus ``bias_table[h, b]`` (T5, ``(1, H, 1, nb)``); None with neither."""
    term = q @ key_table.T * key_scale if key_table is not None else None
    if bias_table is not None:
        bias = bias_table[None, :, None, :]
        term = bias if term is None else term + bias
    return term


def _shift(term: Tensor | None, bucket: int) -> Tensor | float:
    """A far side's constant logit term, ``(B|1, H, N|1)``."""
    return term[..., bucket] if term is not None else 0.0


def _rows_of(term: Tensor, rows: slice) -> Tensor:
    if term.shape[2] == 1:
        return term.expand(-1, -1, rows.stop - rows.start, -1)
    return term[:, :, rows]


def _near_logits(blk: Block, scaled_q: Tensor, k: Tensor, term: Tensor | None, out: Tensor):
    torch.matmul(scaled_q[:, :, blk.rows], k[:, :, blk.near].transpose(-2, -1), out=out)
    if term is not None:
        out += gather_buckets(_rows_of(term, blk.rows), blk.ids)
    if blk.allowed is not None:
        out.masked_fill_(~blk.allowed, float("-inf"))
    return out


def _near_shape(blk: Block, q: Tensor) -> tuple[int, int, int, int]:
    return (*q.shape[:2], blk.rows.stop - blk.rows.start, blk.near.stop - blk.near.start)


def _near_forward(blk, scaled_q, k, v, term, value_table, buckets, scratch):
    """Output (normalised within the near keys) and logsumexp of the near region."""
    logits = _near_logits(blk, scaled_q, k, term, scratch.take(0, _near_shape(blk, scaled_q)))
    top = logits.amax(dim=-1, keepdim=True)  # the diagonal key is always allowed: finite
    weight = logits.sub_(top).exp_()  # unnormalised: one pass fewer than a logsumexp
    total = weight.sum(dim=-1, keepdim=True)
    out = weight @ v[:, :, blk.near]
    if value_table is not None:
        out += sum_per_bucket(weight, blk.ids, buckets) @ value_table
    return out.div_(total), (top + total.log()).squeeze(-1)


def _near_backward(blk, scaled_q, k, v, grad_out, lse, row_dot, term, value_table, scale, grads):
    """Add the near region's share of every gradient to ``grads``."""
    rows, near = blk.rows, blk.near
    shape = _near_shape(blk, scaled_q)
    prob = _near_logits(blk, scaled_q, k, term, grads.scratch.take(0, shape))
    probabilities_(prob.sub_(lse[:, :, rows, None]))  # the true weights
    grad = grad_out[:, :, rows]
    d_logits = grads.scratch.take(1, shape)  # first d_prob
    torch.matmul(grad, v[:, :, near].transpose(-2, -1), out=d_logits)
    if value_table is not None:
        d_logits += gather_buckets(grad @ value_table.T, blk.ids)
    d_logits.sub_(row_dot[:, :, rows, None]).mul_(prob)
    grads.dq[:, :, rows].add_(d_logits @ k[:, :, near], alpha=scale)
    grads.dk[:, :, near].add_(d_logits.transpose(-2, -1) @ scaled_q[:, :, rows])
    grads.dv[:, :, near].add_(prob.transpose(-2, -1) @ grad)
    if grads.term is not None:
        summed = reduce_to(d_logits, (grads.term.shape[0], *d_logits.shape[1:]))
        grads.add_term(rows, sum_per_bucket(summed, blk.ids, grads.term.shape[-1]))
    if grads.mass is not None:
        grads.mass[:, :, rows] += sum_per_bucket(prob, blk.ids, grads.mass.shape[-1])


def clipped_relative_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_table: Tensor | None,
    value_table: Tensor | None,
    clip: int,
    scale: float,
    key_scale: float,
    causal: bool = False,
) -> Tensor:
    """Shaw: ``softmax(q k^T * scale + key_scale * q . w^K[b_ij]) (v + w^V[b_ij])`` with
    ``b_ij = clip(j - i, -clip, clip) + clip`` over consecutive positions, queries the last
    ``Nq`` keys; ``q`` ``(B, H, Nq, d)``, ``k, v`` ``(B, H, Nk, d)``, tables ``(2 clip + 1, d)``
    or None. CPU only (the flash kernel it calls is the CPU one)."""
    lookup = torch.arange(2 * clip + 1, device=q.device)
    return _ClippedRelativeAttention.apply(
        q, k, v, key_table, None, value_table, lookup, scale, key_scale, causal
    )


def saturating_bias_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias_table: Tensor,
    lookup: Tensor,
    scale: float,
    causal: bool = False,
) -> Tensor:
    """T5: ``softmax(q k^T * scale + bias_table[h, b_ij]) v`` with ``b_ij = lookup[clamp(j - i,
    -K, K) + K]`` for a ``lookup`` of ``2K + 1`` buckets (past distance K the bucket no longer
    changes), ``bias_table`` ``(H, nb)``; positions and device as for
    ``clipped_relative_attention``."""
    return _ClippedRelativeAttention.apply(
        q, k, v, None, bias_table, None, lookup, scale, 1.0, causal
    )

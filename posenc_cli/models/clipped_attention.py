"""Attention with clipped relative terms on the flash kernel, CPU, forward and backward.

Shaw et al.'s key and value terms look up a table row by ``clip(j - i, -K, K)``. For a block of
queries ``i in [s, e)`` the keys fall in three regions:

- far left, ``j < s - K``: every pair is in bucket 0, so the key term is one number per query,
  ``q_i . w^K[0]``, and the value term the one vector ``w^V[0]``;
- far right, ``j > e - 1 + K``: the same with the last bucket;
- near, the ``c + 2K`` keys in between, where the buckets vary.

A per-query constant added to a region's logits only shifts that region's logsumexp, so each far
region is plain attention: the flash kernel gives its output and logsumexp, the constant is added
to the logsumexp, and the regions are merged by their logsumexps (the flash-decoding merge). The
near region is small and computed explicitly. The value term of a far region is its softmax mass
times the one table row. No (N, N) tensor exists in either pass.

Backward: the flash backward takes ``out`` and ``lse`` as given and forms
``dS = P * (dO v^T - rowsum(dO * out))`` with ``P = exp(q k^T * scale - lse)``. Giving it the total
logsumexp minus the region's constant (the true probabilities) and ``out - w^V[b]`` (so that the
row sum carries the value term) makes its dq, dk, dv exactly the region's share of the true
gradient. The key-term and table gradients of a far region are one number per query,
``sum_j dS_ij = mass * dO . (o_region + w^V[b] - out)``.

T5's buckets also stop changing past ``max_distance``: the same kernel takes its per-head bias
table in place of Shaw's key term (``saturating_bias_attention``), with the buckets of the band
read from T5's lookup table.

Positions must be consecutive (``k_pos = arange(start, start + Nk)``, queries the last ``Nq``),
with no key mask and no dropout; ``ShawRelative.attend`` checks this and otherwise lets the
attention module take its generic path.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc_cli.encodings.base import gather_buckets, sum_per_bucket

BLOCK = 128  # query rows per block: the near region is BLOCK x (BLOCK + 2K)
# Below this many (query, key) pairs the explicit softmax path is faster: with B=4, H=8, d=64
# and k=4 it measured 1.25x of no encoding against 1.38x here at N=384; at N=512 this path
# measured 1.55x against 2.1x (benchmarks/attention_overhead.py shape).
MIN_PAIRS = 384 * 384
# T5: the band is 2 max_distance + BLOCK keys wide, so the kernel pays only when the keys are many
# times max_distance. With max_distance 128 (B=4, H=8, d=64): at N = 1024 it measured 1.46-1.59x
# of no encoding against 1.38-1.46x for biased_sdpa; at N = 2048 1.55x against 1.76x.
SATURATED_MIN_KEYS = 16

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def applies(q: Tensor, k_pos: Tensor) -> bool:
    """Whether the kernel can run: the CPU flash kernel in float32/64, over consecutive 1D
    positions (the regions are ranges of key indices)."""
    return (
        q.device.type == "cpu"
        and q.dtype in (torch.float32, torch.float64)
        and k_pos.dim() == 1
        and bool((k_pos.diff() == 1).all())
    )


class Block:
    """The key regions of query rows ``[s, e)`` (key index ``i + offset``), clip distance K;
    ``lookup[r + K]`` is the bucket of relative position r in -K..K."""

    def __init__(self, s: int, e: int, offset: int, keys: int, causal: bool, lookup: Tensor):
        clip, device = (len(lookup) - 1) // 2, lookup.device
        self.rows = slice(s, e)
        self.left = min(max(s + offset - clip, 0), keys)  # far left: keys [0, left)
        right = min(max(e + offset + clip, self.left), keys)
        # far right: keys [right, keys), none under a causal mask (they are all in the future)
        self.right = keys if causal else right
        self.near = slice(self.left, right)
        query = torch.arange(s, e, device=device)[:, None] + offset  # (c, 1)
        rel = torch.arange(self.left, right, device=device)[None, :] - query  # (c, w)
        self.ids = lookup[rel.clamp(-clip, clip) + clip]  # (c, w) bucket of every near pair
        self.allowed = rel <= 0 if causal else None  # (c, w) or None

    def far_regions(self, keys: int) -> tuple[slice, slice]:
        return slice(0, self.left), slice(self.right, keys)


def merge(parts: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """Outputs ``(B, H, c, d)`` with logsumexps ``(B, H, c)`` of disjoint key regions -> the
    output and logsumexp of attention over their union."""
    lse = torch.logsumexp(torch.stack([lse for _, lse in parts]), dim=0)
    out = sum(out * (part_lse - lse).exp()[..., None] for out, part_lse in parts)
    return out, lse


class _ClippedRelativeAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, key_table, bias_table, value_table, lookup, scale, key_scale, causal):
        B, H, N, d = q.shape
        keys = k.shape[-2]
        offset = keys - N
        buckets = _buckets(key_table, bias_table, value_table)
        ends = _ends(lookup)
        out = torch.empty_like(q)
        lse = q.new_empty(B, H, N)
        far = q.new_zeros(2, B, H, N, d)  # the far regions' own outputs, for the backward pass
        far_lse = q.new_full((2, B, H, N), float("-inf"))
        for s in range(0, N, BLOCK):
            blk = Block(s, min(N, s + BLOCK), offset, keys, causal, lookup)
            rows = blk.rows
            qb = q[:, :, rows]
            key_term = _key_term(
                qb, key_table, bias_table, key_scale, buckets
            )  # (B, H, c, buckets)
            parts = [_near_forward(blk, qb, k, v, key_term, value_table, scale, buckets)]
            for (side, bucket), region in zip(ends, blk.far_regions(keys), strict=True):
                if region.stop <= region.start:
                    continue
                o, region_lse = _flash(qb, k[:, :, region], v[:, :, region], scale=scale)
                region_lse = region_lse + key_term[..., bucket]
                far[side, :, :, rows], far_lse[side, :, :, rows] = o, region_lse
                if value_table is not None:
                    o = o + value_table[bucket]
                parts.append((o, region_lse))
            out[:, :, rows], lse[:, :, rows] = merge(parts)
        ctx.save_for_backward(q, k, v, key_table, bias_table, value_table, lookup, out, lse)
        ctx.far = (far, far_lse)
        ctx.args = (scale, key_scale, causal)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, key_table, bias_table, value_table, lookup, out, lse = ctx.saved_tensors
        far, far_lse = ctx.far
        scale, key_scale, causal = ctx.args
        B, H, N, d = q.shape
        keys = k.shape[-2]
        offset = keys - N
        buckets = _buckets(key_table, bias_table, value_table)
        ends = _ends(lookup)
        grad_out = grad_out.contiguous()
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        d_key_term = q.new_zeros(B, H, N, buckets)  # gradient of each query's bucket logit
        mass = q.new_zeros(B, H, N, buckets)  # attention weight per bucket, for d w^V
        row_dot = (grad_out * out).sum(-1)  # (B, H, N)
        for s in range(0, N, BLOCK):
            blk = Block(s, min(N, s + BLOCK), offset, keys, causal, lookup)
            rows = blk.rows
            qb, gb, ob, lb = q[:, :, rows], grad_out[:, :, rows], out[:, :, rows], lse[:, :, rows]
            key_term = _key_term(qb, key_table, bias_table, key_scale, buckets)
            grads = _near_backward(
                blk, qb, k, v, gb, lb, row_dot[:, :, rows], key_term, value_table, scale, buckets
            )
            dq[:, :, rows] += grads[0]
            dk[:, :, blk.near] += grads[1]
            dv[:, :, blk.near] += grads[2]
            d_key_term[:, :, rows] += grads[3]
            mass[:, :, rows] += grads[4]
            for (side, bucket), region in zip(ends, blk.far_regions(keys), strict=True):
                if region.stop <= region.start:
                    continue
                row = value_table[bucket] if value_table is not None else q.new_zeros(d)
                shift = key_term[..., bucket]  # (B, H, c)
                g_q, g_k, g_v = _flash_backward(
                    gb, qb, k[:, :, region], v[:, :, region], ob - row, lb - shift,
                    0.0, False, scale=scale,
                )  # fmt: skip
                dq[:, :, rows] += g_q
                dk[:, :, region] += g_k
                dv[:, :, region] += g_v
                weight = (far_lse[side, :, :, rows] - lb).exp()  # (B, H, c) softmax mass
                o_row = far[side, :, :, rows] + row
                d_key_term[:, :, rows, bucket] += weight * (
                    (gb * o_row).sum(-1) - row_dot[:, :, rows]
                )
                mass[:, :, rows, bucket] += weight
        d_key_table = d_bias_table = d_value_table = None
        if bias_table is not None:
            d_bias_table = d_key_term.sum(dim=(0, 2))  # (H, nb)
        if key_table is not None:
            dq += d_key_term @ key_table * key_scale
            d_key_table = d_key_term.reshape(-1, buckets).T @ q.reshape(-1, d) * key_scale
        if value_table is not None:
            d_value_table = mass.reshape(-1, buckets).T @ grad_out.reshape(-1, d)
        return dq, dk, dv, d_key_table, d_bias_table, d_value_table, None, None, None, None


def _buckets(key_table, bias_table, value_table) -> int:
    if key_table is not None:
        return key_table.shape[0]
    return bias_table.shape[1] if bias_table is not None else value_table.shape[0]


def _ends(lookup: Tensor) -> tuple[tuple[int, int], tuple[int, int]]:
    """(side, bucket) of the far left and the far right: every key there is in that bucket."""
    return (0, int(lookup[0])), (1, int(lookup[-1]))


def _key_term(q, key_table, bias_table, key_scale: float, buckets: int) -> Tensor:
    """Each query's logit term for every bucket, ``(B, H, c, buckets)``: ``q . w^K[b] *
    key_scale`` (Shaw) plus ``bias_table[h, b]`` (T5); zeros with neither."""
    term = q.new_zeros(*q.shape[:-1], buckets)
    if key_table is not None:
        term = term + q @ key_table.T * key_scale
    if bias_table is not None:
        term = term + bias_table[:, None, :]  # (H, 1, nb): the same for every query
    return term


def _near_logits(blk: Block, q: Tensor, k: Tensor, key_term: Tensor, scale: float) -> Tensor:
    logits = q @ k[:, :, blk.near].transpose(-2, -1) * scale  # (B, H, c, w)
    logits = logits + gather_buckets(key_term, blk.ids)
    if blk.allowed is not None:
        logits = logits.masked_fill(~blk.allowed, float("-inf"))
    return logits


def _near_forward(blk, q, k, v, key_term, value_table, scale, buckets) -> tuple[Tensor, Tensor]:
    """Output (normalised within the near keys) and logsumexp of the near region."""
    logits = _near_logits(blk, q, k, key_term, scale)
    lse = torch.logsumexp(logits, dim=-1)  # (B, H, c)
    prob = (logits - lse[..., None]).exp()
    out = prob @ v[:, :, blk.near]
    if value_table is not None:
        out = out + sum_per_bucket(prob, blk.ids, buckets) @ value_table
    return out, lse


def _near_backward(blk, q, k, v, grad, lse, row_dot, key_term, value_table, scale, buckets):
    """The near region's share of dq, dk, dv, of the key-term gradient and of the bucket mass."""
    prob = (_near_logits(blk, q, k, key_term, scale) - lse[..., None]).exp()  # true weights
    d_prob = grad @ v[:, :, blk.near].transpose(-2, -1)  # (B, H, c, w)
    if value_table is not None:
        d_prob = d_prob + gather_buckets(grad @ value_table.T, blk.ids)
    d_logits = prob * (d_prob - row_dot[..., None])
    dq = d_logits @ k[:, :, blk.near] * scale
    dk = d_logits.transpose(-2, -1) @ q * scale
    dv = prob.transpose(-2, -1) @ grad
    return (
        dq,
        dk,
        dv,
        sum_per_bucket(d_logits, blk.ids, buckets),
        sum_per_bucket(prob, blk.ids, buckets),
    )


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

"""CoPE's causal attention in blocks of queries, forward and backward by hand.

CoPE's positions are a running sum of gates along each query's row, and the gates read the same
scaled ``q . k`` as the logits. Everything a query needs lies in its own row, so a block of
query rows is computed whole and on its own: the scores once (gate and logit alike), the
gates, their running sum, the fractional positions, the table term ``q . e[p]`` blended between
two entries of ``z = q e^T``, and the softmax. Under the causal mask a block of rows ``[s, t)``
sees keys up to its last query only (the staircase). Past ``KEEP_PAIRS`` only the output is kept,
so memory grows linearly in N, and the backward computes each block again; below, the forward
keeps each block's terms. The gradients, with ``p_ij = C_ii - C_ij + g_ij`` (C the running sum
of the gates over keys) and the table term ``z[floor p] + frac * step[floor p]``:

    dL = P * (dO v^T - rowsum(dO * O))             the logits' gradient (= the bias's)
    dz[floor p] += dL,  dstep[floor p] += dL frac,  step_m = z_{m+1} - z_m
    dp = dL * step[floor p]                        0 at the cap, where the count was clamped
    dg_it = sum_{j <= t} dp_ij  (t up to the query: a running sum of dp along the row)
    ds = dL + dg * g (1 - g);  dq = scale ds k + dz e;  dk = scale ds^T q;  de = dz^T q

The autograd form (``encodings/cope.py``'s bias on the attention module's paths) made the scores
twice and about twenty passes over the ``(B, H, N, N)`` pairs, each kept for the backward.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

# Query rows per block. One causal layer fwd+bwd (B=4, H=8, d=64), against causal `none`: at
# N=1024 blocks of 32, 64, 128 and 256 rows took 2.21x, 2.13x, 2.35x and 2.95x, at 2048 4.03x,
# 3.03x, 3.15x and 4.47x; once q, k and v were laid out heads first, 32, 64 and 128 rows took
# 1.72x, 1.70x and 2.13x at N=1024 and 2.12x, 2.37x and 2.60x at 2048
ROWS = 64
# Up to this many (query, key) pairs in all, the forward keeps its blocks' terms for the
# backward instead of computing them again (about 24 bytes a pair in float32): the recomputation
# was a quarter of a training step's CoPE attention at B=32, N=64
KEEP_PAIRS = 1 << 21


class _Block(NamedTuple):
    logits: Tensor  # (B, H, r, e), masked pairs at the dtype's minimum
    gates: Tensor  # g, sigmoid of the scaled scores
    frac: Tensor  # p - floor(p)
    index: Tensor  # floor(p), int64
    slope: Tensor  # z[floor p + 1] - z[floor p]; 0 at the cap, so no gradient reaches p there


def _block(q: Tensor, k: Tensor, table: Tensor, scale: float, first: int, key_ok: Tensor | None):
    """The terms of query rows ``q`` (B, H, r, d) against keys ``k`` (B, H, e, d); the first row
    is key ``first``, each later row the next key; ``key_ok`` (B, e) marks the real keys."""
    r, e = q.shape[-2], k.shape[-2]
    npos = table.shape[-2]
    logits = torch.matmul(q * scale, k.transpose(-2, -1))
    gates = torch.sigmoid(logits)
    rows = torch.arange(r, device=q.device)
    counted = gates.cumsum(-1)
    own = counted[..., rows, rows + first]  # C_ii: the running sum up to the query's own key
    # p = C_ii - C_ij + g_ij: > 0 wherever the query sees the key; later keys clamp to 0
    frac = torch.sub(gates, counted, out=counted).add_(own[..., None]).clamp_(0, npos - 1)
    index = frac.long()  # floor, p being >= 0
    frac.sub_(index)
    z = torch.matmul(q, table.transpose(-2, -1))  # (B, H, r, npos): q . e[m] at every m
    slope = F.pad(z.diff(dim=-1), (0, 1)).gather(-1, index)
    logits.add_(z.gather(-1, index)).addcmul_(frac, slope)
    hidden = torch.arange(e, device=q.device)[None, :] > rows[:, None] + first  # later keys
    if key_ok is not None:
        hidden = hidden | ~key_ok[:, None, None, :]
    logits.masked_fill_(hidden, torch.finfo(logits.dtype).min)
    return _Block(logits, gates, frac, index, slope)


def _attend(q, k, v, table, scale, key_ok, keep: bool) -> tuple[Tensor, list[_Block]]:
    """The output, block by block, and (``keep``) each block's terms with the softmax in place
    of the logits."""
    N = q.shape[-2]
    offset = k.shape[-2] - N  # the queries are the last keys
    outs, kept = [], []
    for s in range(0, N, ROWS):
        e = min(N, s + ROWS) + offset
        ok = None if key_ok is None else key_ok[:, :e]
        block = _block(q[:, :, s : s + ROWS], k[:, :, :e], table, scale, s + offset, ok)
        # softmax, not exp(logits - logsumexp): exp of the masked pairs' minimum (or of
        # anything under -87 in float32) leaves the vectorised path, 6x slower here
        prob = block.logits.softmax(-1)
        outs.append(torch.matmul(prob, v[:, :, :e]))
        if keep:
            kept.append(block._replace(logits=prob))
    return (torch.cat(outs, dim=-2) if len(outs) > 1 else outs[0]), kept


class _CopeAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, table, scale, key_ok):
        keep = q.shape[0] * q.shape[1] * q.shape[-2] * k.shape[-2] <= KEEP_PAIRS
        out, ctx.kept = _attend(q, k, v, table, scale, key_ok, keep)
        ctx.save_for_backward(q, k, v, table, out, key_ok)
        ctx.scale, ctx.step = scale, ROWS
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, table, out, key_ok = ctx.saved_tensors
        scale, step = ctx.scale, ctx.step
        N, npos = q.shape[-2], table.shape[-2]
        offset = k.shape[-2] - N
        grad_out = grad_out.contiguous()
        row_dot = (grad_out * out).sum(-1, keepdim=True)  # (B, H, N, 1)
        dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        dtable = torch.zeros_like(table)
        for number, s in enumerate(range(0, N, step)):
            t = min(N, s + step)
            e = t + offset
            q_b, k_e, v_e, do = q[:, :, s:t], k[:, :, :e], v[:, :, :e], grad_out[:, :, s:t]
            if ctx.kept:
                block = ctx.kept[number]
                prob = block.logits
            else:
                ok = None if key_ok is None else key_ok[:, :e]
                block = _block(q_b, k_e, table, scale, s + offset, ok)
                prob = block.logits.softmax(-1)
            dv[:, :, :e] += torch.matmul(prob.transpose(-2, -1), do)
            d_logits = torch.matmul(do, v_e.transpose(-2, -1))
            d_logits.sub_(row_dot[:, :, s:t]).mul_(prob)  # 0 at masked pairs
            # the table term z[floor p] + frac * step[floor p], step_m = z_{m+1} - z_m
            dz = q.new_zeros(*d_logits.shape[:-1], npos).scatter_add_(-1, block.index, d_logits)
            weighted = d_logits * block.frac
            d_step = torch.zeros_like(dz).scatter_add_(-1, block.index, weighted)[..., :-1]
            dz[..., :-1] -= d_step
            dz[..., 1:] += d_step
            # the positions: p_ij = sum_{t=j..i} g_it, so dg_it = sum_{j <= t} dp_ij
            d_gates = torch.mul(d_logits, block.slope, out=weighted).cumsum_(-1)
            sigmoid_slope = torch.addcmul(block.gates, block.gates, block.gates, value=-1)
            sigmoid_slope.tril_(s + offset)  # only keys up to the query count
            d_scores = d_gates.mul_(sigmoid_slope).add_(d_logits)
            dq[:, :, s:t] = torch.matmul(d_scores, k_e).mul_(scale) + torch.matmul(dz, table)
            dk[:, :, :e] += torch.matmul(d_scores.transpose(-2, -1), q_b).mul_(scale)
            dtable += torch.matmul(dz.transpose(-2, -1), q_b).sum(0)
        ctx.kept = None
        return dq, dk, dv, dtable, None, None


def cope_attention(
    q: Tensor, k: Tensor, v: Tensor, table: Tensor, scale: float, key_mask: Tensor | None = None
) -> Tensor:
    """Causal CoPE attention over consecutive positions, the queries the last ``Nq`` of the
    ``Nk`` keys: ``q`` (B, H, Nq, d), ``k`` and ``v`` (B, H, Nk, d), ``table`` (H, npos, d),
    ``key_mask`` (B, Nk) True at real keys. Every query must see a real key: with the first
    key real (right padding) it always does."""
    # the attention module's heads are a view of (B, N, H, d): laid out heads first once here,
    # or every block's products copy their slices again
    q, k, v = (t.contiguous() for t in (q, k, v))
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, table)):
        return _CopeAttention.apply(q, k, v, table, scale, key_mask)
    return _attend(q, k, v, table, scale, key_mask, keep=False)[0]

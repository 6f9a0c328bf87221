"""Attention over a fixed list of 2D slots, one slot at a time, with a hand-written backward.

Window attention on an image grid (``models/window.py``) gives every patch query the same ``K``
slots, each a 2D offset (query minus key). Here each slot's keys are a shifted view of the
zero-padded key grid, so nothing of size ``(N, K, d)`` is gathered, and the softmax runs online
over the slots (FlashAttention's running maximum and sum, Dao et al. 2022), so not even the
``(N, K)`` logits are held: the forward keeps ``O(N d)``; the backward recomputes each slot's
probabilities from the saved log-sum-exp and adds its gradients into the padded grids in place.

``slot_attention(q, k, v, offsets, valid, scale, height, width, bias=None)`` returns the output
and the log-sum-exp of every query, ``(B, H, N, d)`` and ``(B, H, N)``; the log-sum-exp lets a
caller join the slots with other keys (global tokens) exactly. ``bias`` is an optional additive
logit term per slot, ``(B|1, H|1, N|1, K)``, which receives its gradient. Masked slots
(``valid`` False: off the grid, or a key counted elsewhere) take no weight; a query with no valid
slot gets a zero output and a log-sum-exp of -inf.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def shifted(padded: Tensor, reach: int, offset: tuple[int, int], rows: slice, width: int):
    """The key of every query of grid rows ``rows`` at one slot: a ``(B, H, r, w, d)`` view of
    the grid padded by ``reach``."""
    a, b = offset
    return padded[
        :, :, reach - a + rows.start : reach - a + rows.stop, reach - b : reach - b + width
    ]


def grids(q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, height: int, width: int):
    """``(offsets as pairs, reach, q on the grid, k and v on the grid padded by reach)``, the
    grids ``shifted`` takes views of; ``(B, H, N, d)`` in, ``(B, H, h(+2r), w(+2r), d)`` out."""
    B, H, _, d = q.shape
    offs = [(int(a), int(b)) for a, b in offsets.tolist()]
    reach = max((max(abs(a), abs(b)) for a, b in offs), default=0)
    pad = (0, 0, reach, reach, reach, reach)
    q5 = q.reshape(B, H, height, width, d)
    kp = F.pad(k.reshape(B, H, height, width, d), pad)
    vp = F.pad(v.reshape(B, H, height, width, d), pad)
    return offs, reach, q5, kp, vp


# Grid rows are taken a band at a time, each band's queries through every slot before the next:
# a whole 128 x 128 grid's (B, H, h, w, d) tensors are tens of MB, and streaming all of them once
# per slot made the time per patch grow sevenfold from 32 x 32 to 128 x 128 patches.
BAND_ELEMENTS = 1 << 18  # about 1 MB of float32 per (B, H, rows, w, d) band of queries


def row_bands(q5: Tensor) -> list[slice]:
    B, H, height, width, d = q5.shape
    rows = max(1, BAND_ELEMENTS // (B * H * width * d))
    return [slice(r, min(r + rows, height)) for r in range(0, height, rows)]


class _SlotAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, bias, offsets, valid, scale, height, width):
        B, H, N, d = q.shape
        offs, reach, q5, kp, vp = grids(q, k, v, offsets, height, width)
        mask = valid.reshape(height, width, -1)
        bias5 = None if bias is None else _grid_bias(bias, height, width)
        neg = torch.tensor(float("-inf"), dtype=q.dtype, device=q.device)
        out, lse = torch.empty_like(q5), q5.new_empty(B, H, height, width)
        for rows in row_bands(q5):
            q_band = q5[:, :, rows]
            m = torch.full(q_band.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
            total, acc = torch.zeros_like(m), torch.zeros_like(q_band)
            for s, offset in enumerate(offs):
                k_s = shifted(kp, reach, offset, rows, width)
                score = torch.linalg.vecdot(q_band, k_s) * scale
                if bias5 is not None:
                    score = score + _band(bias5, rows)[..., s]
                score = torch.where(mask[rows, :, s], score, neg)
                m_new = torch.maximum(m, score)
                safe = torch.where(torch.isinf(m_new), 0.0, m_new)  # nothing valid yet
                rescale, p = torch.exp(m - safe), torch.exp(score - safe)
                total = total * rescale + p
                v_s = shifted(vp, reach, offset, rows, width)
                acc.mul_(rescale[..., None]).addcmul_(p[..., None], v_s)  # O(band d) held
                m = m_new
            kept = total > 0
            out[:, :, rows] = acc / torch.where(kept, total, 1.0)[..., None]
            lse[:, :, rows] = torch.where(kept, m + torch.log(torch.where(kept, total, 1.0)), neg)
        # the padded grids, not k and v: the backward reads them as they are, so it need not
        # pad k and v again while they are still held
        ctx.save_for_backward(q, kp, vp, bias, out, lse, valid)
        ctx.scale, ctx.height, ctx.width, ctx.offs, ctx.reach = scale, height, width, offs, reach
        return out.reshape(B, H, N, d), lse.reshape(B, H, N)

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, kp, vp, bias, out, lse, valid = ctx.saved_tensors
        scale, height, width, offs, reach = ctx.scale, ctx.height, ctx.width, ctx.offs, ctx.reach
        B, H, N, d = q.shape
        q5 = q.reshape(B, H, height, width, d)
        mask = valid.reshape(height, width, -1)
        bias5 = None if bias is None else _grid_bias(bias, height, width)
        d_out = grad_out.reshape(B, H, height, width, d)
        d_lse = torch.zeros_like(lse) if grad_lse is None else grad_lse.reshape(lse.shape)
        finite_lse = torch.where(torch.isinf(lse), 0.0, lse)
        row = (d_out * out).sum(-1) - d_lse  # FlashAttention's D, less the lse's own gradient
        dq = torch.zeros_like(q5)
        dkp, dvp = torch.zeros_like(kp), torch.zeros_like(vp)
        wants_bias = bias is not None and ctx.needs_input_grad[3]
        d_bias = q5.new_zeros(B, H, height, width, len(offs)) if wants_bias else None
        for rows in row_bands(q5):
            q_band, d_band, lse_band, row_band = (
                q5[:, :, rows], d_out[:, :, rows], finite_lse[:, :, rows], row[:, :, rows],
            )  # fmt: skip
            for s, offset in enumerate(offs):
                k_s = shifted(kp, reach, offset, rows, width)
                v_s = shifted(vp, reach, offset, rows, width)
                score = torch.linalg.vecdot(q_band, k_s) * scale
                if bias5 is not None:
                    score = score + _band(bias5, rows)[..., s]
                p = torch.where(mask[rows, :, s], torch.exp(score - lse_band), 0.0)
                shifted(dvp, reach, offset, rows, width).addcmul_(p[..., None], d_band)
                ds = p * (torch.linalg.vecdot(d_band, v_s) - row_band)
                if d_bias is not None:
                    d_bias[:, :, rows, :, s] = ds
                dq[:, :, rows].addcmul_(ds[..., None], k_s, value=scale)
                shifted(dkp, reach, offset, rows, width).addcmul_(
                    ds[..., None], q_band, value=scale
                )
        inner = (
            slice(None),
            slice(None),
            slice(reach, reach + height),
            slice(reach, reach + width),
        )
        dk = dkp[inner].reshape(B, H, N, d)
        del dkp  # one padded gradient grid at a time beside its copy
        dv = dvp[inner].reshape(B, H, N, d)
        del dvp
        grad_bias = None
        if d_bias is not None:
            full = d_bias.reshape(B, H, N, -1)  # (B, H, N, K)
            dims = [i for i in range(3) if bias.shape[i] == 1 and full.shape[i] != 1]
            grad_bias = full.sum(dim=dims, keepdim=True) if dims else full
        grad_q = dq.reshape(B, H, N, d) if ctx.needs_input_grad[0] else None
        return grad_q, dk, dv, grad_bias, None, None, None, None, None


def _band(bias5: Tensor, rows: slice) -> Tensor:
    """The rows of a grid bias, or all of it where it broadcasts over the grid."""
    return bias5 if bias5.shape[2] == 1 else bias5[:, :, rows]


def _grid_bias(bias: Tensor, height: int, width: int) -> Tensor:
    """``(B|1, H|1, N|1, K)`` -> ``(B|1, H|1, h|1, w|1, K)``, broadcasting over the grid."""
    b, h, n, k = bias.shape
    if n == 1:
        return bias.reshape(b, h, 1, 1, k)
    return bias.reshape(b, h, height, width, k)


def slot_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    offsets: Tensor,
    valid: Tensor,
    scale: float,
    height: int,
    width: int,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Output ``(B, H, N, d)`` and log-sum-exp ``(B, H, N)`` of ``N = height * width`` patch
    queries (row-major) over their ``K`` slots at ``offsets`` ``(K, 2)`` (query minus key),
    those with ``valid`` ``(N, K)`` False left out; ``bias`` ``(B|1, H|1, N|1, K)`` is added to
    the slots' logits."""
    return _SlotAttention.apply(q, k, v, bias, offsets, valid, scale, height, width)

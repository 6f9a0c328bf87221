"""ALiBi's ``-m |i - j|`` through the CPU flash kernel without an ``(N, N)`` bias tensor.

Over keys ``j < i`` the bias is ``m (j - c) - m (i - c)`` for any constant ``c``: the second term
is one constant per softmax row, which softmax ignores, and the first is one number per key, a
``(1, H, 1, keys)`` mask that the kernel broadcasts over the rows for free. Over keys ``j > i`` it
is the same with the other sign. So each block of query rows takes three flash calls: the keys
below it and the keys above it with a row of numbers each, and the diagonal block with its dense
``(block, block)`` bias (and, when causal, the mask; nothing above). The calls' outputs merge by
their log-sum-exps, each corrected by the row constant it left out. The backward runs the flash
backward per piece with the merged output and log-sum-exp. That is exact: the merged log-sum-exp
normalises every piece's probabilities, and ``rowsum(dO * O)`` is the same sum over every key.

Nothing quadratic in N is held but one diagonal block. ``c`` is the block's own edge (its first
query for the keys below, its end for those above), so the keys nearest the block, which carry
its weight, see small numbers, and float32 keeps their precision at any length.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
BLOCK = 256  # query rows per block; up to one block the dense bias is all there is anyway


def serves(q: Tensor, k: Tensor, positions_consecutive: bool) -> bool:
    """The CPU flash kernel in float32/64 on square self-attention over consecutive positions
    (keys below and above a query are then ranges of indices), longer than one block."""
    return (
        q.device.type == "cpu"
        and q.dtype in (torch.float32, torch.float64)
        and q.shape[-2] == k.shape[-2] > BLOCK
        and positions_consecutive
    )


def _piece_terms(slopes: Tensor, diagonal: _Diagonal, rows: slice, keys: slice, side: int):
    """A piece's mask and the row constant it leaves out, ``(H, rows)``. Below the block,
    ``-m (i - j) = m (j - s) - m (i - s)``; above it, ``-m (j - i) = -m (j - e) + m (i - e)``.
    Measured from the block's own edge, the numbers of the nearest keys stay small, so float32
    keeps their precision at any N. The diagonal block has its dense bias and no constant."""
    if side == 0:
        return diagonal(rows.stop - rows.start), 0.0
    edge = rows.start if side < 0 else rows.stop
    m = slopes.to(torch.float64)[:, None]
    ids = partial(torch.arange, dtype=torch.float64, device=slopes.device)
    mask = -side * m * (ids(keys.start, keys.stop) - edge)  # (H, keys)
    row = side * m * (ids(rows.start, rows.stop) - edge)  # (H, rows)
    return mask.to(diagonal.dtype)[None, :, None], row.to(diagonal.dtype)


def _row_blocks(n: int, block: int, causal: bool):
    """Per block of query rows ``[s, e)``, its pieces as ``(keys, side)``: the keys below it
    (side -1), the diagonal block (0) and, without a mask, the keys above it (+1)."""
    for s in range(0, n, block):
        e = min(n, s + block)
        below = [(slice(0, s), -1)] if s else []
        above = [(slice(e, n), 1)] if e < n and not causal else []
        yield slice(s, e), [*below, (slice(s, e), 0), *above]


class _SlopeAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, slopes, scale, causal, block):
        diagonal = _Diagonal(slopes, q.dtype, causal)
        out, lse = torch.empty_like(q), q.new_empty(q.shape[:-1])
        for rows, pieces in _row_blocks(q.shape[-2], block, causal):
            outs, lses = [], []
            for keys, side in pieces:
                mask, row = _piece_terms(slopes, diagonal, rows, keys, side)
                o, l = _flash(
                    q[:, :, rows], k[:, :, keys], v[:, :, keys], attn_mask=mask, scale=scale
                )
                outs.append(o)
                lses.append(l + row)  # the row constant the kernel left out
            total = torch.stack(lses).logsumexp(0)
            out[:, :, rows] = sum(
                o * (l - total).exp()[..., None] for o, l in zip(outs, lses, strict=True)
            )
            lse[:, :, rows] = total
        ctx.save_for_backward(q, k, v, slopes, out, lse)
        ctx.settings = (scale, causal, block)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, slopes, out, lse = ctx.saved_tensors
        scale, causal, block = ctx.settings
        diagonal = _Diagonal(slopes, q.dtype, causal)
        grad = grad_out.contiguous()
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for rows, pieces in _row_blocks(q.shape[-2], block, causal):
            for keys, side in pieces:
                mask, row = _piece_terms(slopes, diagonal, rows, keys, side)
                # the kernel's probabilities are exp(its logit - the lse it is given), and its
                # logit lacks the row constant: that goes into the lse instead
                row_lse = lse[:, :, rows] - row
                g_q, g_k, g_v = _flash_backward(
                    grad[:, :, rows], q[:, :, rows], k[:, :, keys], v[:, :, keys],
                    out[:, :, rows], row_lse, 0.0, False, attn_mask=mask, scale=scale,
                )  # fmt: skip
                dq[:, :, rows] += g_q
                dk[:, :, keys] += g_k
                dv[:, :, keys] += g_v
        return dq, dk, dv, None, None, None, None


class _Diagonal:
    """The dense ``-m |i - j|`` (and causal mask) of a diagonal block, built once per size."""

    def __init__(self, slopes: Tensor, dtype: torch.dtype, causal: bool) -> None:
        self.slopes, self.dtype, self.causal = slopes, dtype, causal
        self.cache: dict[int, Tensor] = {}

    def __call__(self, size: int) -> Tensor:
        if size not in self.cache:
            i = torch.arange(size, device=self.slopes.device)
            distance = (i[:, None] - i[None, :]).abs().to(torch.float64)
            bias = (-self.slopes.to(torch.float64)[:, None, None] * distance).to(self.dtype)
            if self.causal:
                bias = bias.masked_fill(i[None, :] > i[:, None], torch.finfo(self.dtype).min)
            self.cache[size] = bias[None]  # (1, H, size, size)
        return self.cache[size]


def slope_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    slopes: Tensor,
    scale: float,
    causal: bool,
    block: int | None = None,
) -> Tensor:
    """``softmax(q k^T * scale - m_h |i - j| [+ causal mask]) v`` for ``(B, H, N, d)`` inputs and
    per-head slopes ``(H,)``, through the flash kernel only."""
    return _SlopeAttention.apply(q, k, v, slopes, scale, causal, block or BLOCK)

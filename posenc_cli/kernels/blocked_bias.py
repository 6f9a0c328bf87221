"""Attention with a content-free bias, built one block of queries at a time, on the CPU flash
kernel, forward and backward.

Handing SDPA a whole ``(H, Nq, Nk)`` bias costs twice: the tensor itself (memory quadratic in N)
and, under a causal mask, the full square, since a mask passed as ``attn_mask`` stops the kernel
from skipping the upper triangle the way ``is_causal`` does. Content-free biases (ALiBi, T5,
KERPLE, Sandwich, FIRE, Swin, iRPE's bias mode) are a function of the positions alone, so the
bias of queries ``[s, e)`` can be asked of the encoding when that block is reached:

- forward: per block, ``bias(q_pos[s:e], k_pos[:visible])`` with the causal mask folded in, one
  flash call, its output and logsumexp kept; causal blocks see keys up to their own end only (the
  staircase), so about half the square is computed;
- backward: per block, the flash backward takes the same bias and the saved logsumexp and gives
  dq, dk and dv; when the bias has learned parameters, ``dS = P * (dO v^T - rowsum(dO * O))`` of
  the block is the bias's gradient, sent to the parameters through the encoding's own ``bias``,
  recomputed for the block with autograd on.

Only one block's bias exists at a time, so memory grows linearly in N (q, k, v, the output, the
logsumexp and one ``(H, BLOCK, Nk)`` block).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from posenc_cli.kernels.biased_sdpa import reduce_to
from posenc_cli.kernels.positions import consecutive

BLOCK = 256  # query rows per block
_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward

# (the block's q, the keys it sees, their positions) -> bias (1|B, H, rows, keys)
BiasOfBlock = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


# From here on (benchmarks/attention_overhead.py shape, B=4, H=8, d=64) the kernel is at least as
# fast as one (H, N, N) bias: under a causal mask, at 512 keys, it measured 0.94x (ALiBi) and
# 0.81x (KERPLE) of the dense path in training, and at 1024 ALiBi took 1.06x of causal `none`
# against 2.02x. Without a mask, in training, ALiBi pays 1.05-1.09x of its dense bias at 512-1024
# tokens (KERPLE 0.96x), the price of memory that grows linearly; without gradients 0.85-1.07x
# (KERPLE 0.3-0.5x). 512 tokens is also the smallest probe of profiling/budget.py, so the
# memory it extrapolates is this kernel's.
CAUSAL_MIN_KEYS = 512
MIN_PAIRS = 512 * 512


def worth(q: Tensor, k: Tensor, causal: bool) -> bool:
    """Whether the kernel can run (the CPU flash kernel in float32/64) and pays: from
    ``CAUSAL_MIN_KEYS`` keys under a causal mask, from ``MIN_PAIRS`` pairs without."""
    if q.device.type != "cpu" or q.dtype not in (torch.float32, torch.float64):
        return False
    Nq, Nk = q.shape[-2], k.shape[-2]
    return Nk >= CAUSAL_MIN_KEYS if causal else Nq * Nk >= MIN_PAIRS


def blocks(q_pos: Tensor, k_pos: Tensor, causal: bool, block: int):
    """``(rows, keys)`` slices of every query block; a causal block over consecutive positions
    sees the keys up to its own last query (the rest are masked anyway)."""
    Nq, Nk = len(q_pos), len(k_pos)
    prefix = causal and consecutive(k_pos)
    for s in range(0, Nq, block):
        e = min(Nq, s + block)
        yield slice(s, e), slice(0, Nk - Nq + e if prefix else Nk)


def masked_bias(
    bias_of_block: BiasOfBlock, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, causal: bool
) -> Tensor:
    """The block's bias in q's dtype, the causal mask folded in as the dtype's lowest value."""
    dtype = q.dtype
    bias = bias_of_block(q, k, q_pos, k_pos).to(dtype)
    if causal:
        hidden = k_pos[None, :] > q_pos[:, None]  # (rows, keys)
        bias = bias.masked_fill(hidden, torch.finfo(dtype).min)
    return bias


def table_lookup(table: Tensor, low: int) -> BiasOfBlock:
    """The blocks of a bias of ``j - i`` alone from its value per distance, ``table`` ``(H, n)``
    starting at distance ``low``. A block then costs a lookup instead of the encoding's
    arithmetic, and the table's gradient (a sum over each diagonal, which autograd's
    index_select backward gives) reaches the encoding's parameters through one autograd edge per
    call instead of one per block."""

    def gather(q: Tensor, k: Tensor, rows: Tensor, keys: Tensor) -> Tensor:
        # int32 ids, shifted before the broadcast: one (rows, keys) index tensor, half the bytes
        ids = keys.to(torch.int32)[None, :] - (rows.to(torch.int32) + low)[:, None]
        return table.index_select(1, ids.flatten()).view(1, -1, *ids.shape)

    return gather


class _BlockedBiasAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, q_pos, k_pos, scale, causal, block, bias_of_block, reads, *leaves):
        out = torch.empty_like(q)
        lse = q.new_empty(q.shape[:-1])
        for rows, keys in blocks(q_pos, k_pos, causal, block):
            q_b, k_b = q[:, :, rows], k[:, :, keys]
            bias = masked_bias(bias_of_block, q_b, k_b, q_pos[rows], k_pos[keys], causal)
            out[:, :, rows], lse[:, :, rows] = _flash(
                q_b, k_b, v[:, :, keys], attn_mask=bias, scale=scale
            )
        ctx.save_for_backward(q, k, v, out, lse, q_pos, k_pos, *leaves)
        ctx.settings = (scale, causal, block, bias_of_block, reads)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, q_pos, k_pos, *leaves = ctx.saved_tensors
        scale, causal, block, bias_of_block, reads = ctx.settings
        needs = ctx.needs_input_grad[10:]  # the leaves' flags, after the ten other inputs
        learned = [leaf for leaf, need in zip(leaves, needs, strict=True) if need]
        grad_out = grad_out.contiguous()
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        leaf_grads = [torch.zeros_like(leaf) for leaf in learned]
        through_bias = bool(learned) or reads  # the bias has a gradient to pass on
        row_dot = (grad_out * out).sum(-1, keepdim=True) if through_bias else None  # (B, H, N, 1)
        for rows, keys in blocks(q_pos, k_pos, causal, block):
            q_b, k_b, v_b, g_b = q[:, :, rows], k[:, :, keys], v[:, :, keys], grad_out[:, :, rows]
            with torch.enable_grad():
                # a content-dependent bias is differentiated at this block's q and k
                q_in, k_in = (t.detach().requires_grad_(reads) for t in (q_b, k_b))
                bias = masked_bias(bias_of_block, q_in, k_in, q_pos[rows], k_pos[keys], causal)
            if not through_bias:
                g_q, g_k, g_v = _flash_backward(
                    g_b, q_b, k_b, v_b, out[:, :, rows], lse[:, :, rows], 0.0, False,
                    attn_mask=bias.detach(), scale=scale,
                )  # fmt: skip
                dq[:, :, rows] += g_q
                dk[:, :, keys] += g_k
                dv[:, :, keys] += g_v
                continue
            # the bias gradient dS is also what dq, dk and dv are made of: one pass for all
            q_s = q_b * scale  # scaled once here, not on every (rows, keys) block below
            prob = torch.matmul(q_s, k_b.transpose(-2, -1))
            prob.add_(bias.detach()).sub_(lse[:, :, rows, None]).exp_()
            dv[:, :, keys] += torch.matmul(prob.transpose(-2, -1), g_b)
            d_score = torch.matmul(g_b, v_b.transpose(-2, -1))
            d_score.sub_(row_dot[:, :, rows]).mul_(prob)  # (B, H, rows, keys)
            dq[:, :, rows] = torch.matmul(d_score, k_b).mul_(scale)
            dk[:, :, keys] += torch.matmul(d_score.transpose(-2, -1), q_s)
            d_bias = reduce_to(d_score, bias.shape)  # a content-free bias is shared by the batch
            inputs = [q_in, k_in, *learned] if reads else learned
            parts = list(torch.autograd.grad(bias, inputs, d_bias, allow_unused=True))
            if reads:
                g_q, g_k = parts.pop(0), parts.pop(0)
                if g_q is not None:
                    dq[:, :, rows] += g_q
                if g_k is not None:
                    dk[:, :, keys] += g_k
            for total, part in zip(leaf_grads, parts, strict=True):
                if part is not None:
                    total += part
        per_leaf = iter(leaf_grads)
        grads = [next(per_leaf) if need else None for need in needs]
        return dq, dk, dv, None, None, None, None, None, None, None, *grads


def blocked_bias_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_pos: Tensor,
    k_pos: Tensor,
    bias_of_block: BiasOfBlock,
    leaves: list[Tensor],
    scale: float,
    causal: bool,
    block: int | None = None,
    reads_content: bool = False,
) -> Tensor:
    """``softmax(q k^T * scale + bias + causal mask) v``, ``(B, H, Nq, d)``, where
    ``bias_of_block(q_rows, k_keys, q_pos[rows], k_pos[keys])`` gives the bias of any block,
    ``(1|B, H, rows, keys)``, and ``leaves`` are the tensors it learns from (their gradients are
    returned through autograd as usual). ``reads_content``: the bias reads the block's q and k
    (at (i, j) only q_i, k_j and the positions: Transformer-XL, DeBERTa), so their gradients
    through it are taken block by block too."""
    return _BlockedBiasAttention.apply(
        q, k, v, q_pos, k_pos, scale, causal, block or BLOCK, bias_of_block, reads_content,
        *leaves,
    )  # fmt: skip

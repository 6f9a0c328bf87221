"""Fused attention with a learned additive bias, fast on the CPU too.

PyTorch's CPU flash kernel accepts an ``attn_mask`` but, when that mask needs a gradient
(T5's learned bias table, Shaw's or XL's q-dependent terms), SDPA falls back to the math path,
which materialises every (B, H, N, N) intermediate and measured 3.2x slower than no bias at
N = 1024 here. This function keeps the flash kernel for the forward pass and writes the backward
pass itself, in query chunks that stay in cache, from the logsumexp the kernel saved:

    P = exp(q k^T * scale + bias - logsumexp),  dS = P * (dO v^T - rowsum(dO * O))
    dq = dS k * scale,  dk = dS^T q * scale,  dv = P^T dO,  dbias = dS

One pass gives all four gradients: the bias gradient needs P and dS, which are also what dq, dk
and dv are made of (calling the flash backward and then a separate bias pass built them twice).
On CUDA (or without a bias gradient) plain SDPA is used: its kernels already handle a bias
gradient efficiently.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

CHUNK_ELEMENTS = 1 << 22  # about 16 MB of float32 per (B, H, chunk, Nk) intermediate


# Below this many (query, key) pairs a learned bias is cheaper on the explicit softmax path than
# on the flash kernel plus a separate bias-gradient pass (benchmarks/irpe_overhead.py --explicit:
# at DeiT-Ti shape, N = 197, 1.31x -> 0.99x of no bias; T5 at B=4, H=8, N=384: 1.45x -> 1.32x);
# from N = 512 on the flash path wins (T5: 1.49x against 1.78x).
EXPLICIT_MAX_PAIRS = 384 * 384


# exp of anything under about -87.3 (the log of float32's smallest normal number) leaves the
# vectorised path: over a tile of (4, 8, 256, 256) with the causal half masked at the dtype's
# minimum, 4.3 ms against 0.84 ms. Clamped there first, such a weight comes out as 1.6e-38
# instead of 0 or a subnormal, below anything a float32 sum of weights can see.
UNDERFLOW = -87.0


def probabilities_(shifted: Tensor) -> Tensor:
    """``exp`` in place of logits less their logsumexp: the softmax weights."""
    return shifted.clamp_(min=UNDERFLOW).exp_()


def reduce_to(grad: Tensor, shape: torch.Size) -> Tensor:
    """Sum a broadcast gradient back to the shape of the tensor that was broadcast."""
    dims = [i for i, (g, s) in enumerate(zip(grad.shape, shape, strict=True)) if s == 1 and g != 1]
    return grad.sum(dim=dims, keepdim=True) if dims else grad


class _FlashBiasAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: float) -> Tensor:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, attn_mask=bias, scale=scale
        )
        ctx.save_for_backward(q, k, v, bias, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q, k, v, bias, out, lse = ctx.saved_tensors
        scale = ctx.scale
        B, H, N, _ = q.shape
        Nk = k.shape[-2]
        # contiguous once: otherwise every chunk's matmul copies all of k and v again
        q, k, v, grad_out = (t.contiguous() for t in (q, k, v, grad_out))
        row_dot = (grad_out * out).sum(-1, keepdim=True)  # (B, H, N, 1)
        step = max(1, CHUNK_ELEMENTS // max(1, B * H * Nk))
        batch_dims = [i for i in (0, 1) if bias.shape[i] == 1]
        k_t, v_t = k.transpose(-2, -1), v.transpose(-2, -1)
        # a bias broadcast over queries or keys is sliced as its full (.., N, Nk) view;
        # reduce_to sums the gradient back to its shape at the end
        full = bias.expand(*bias.shape[:2], N, Nk)
        dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        dbias = None
        if ctx.needs_input_grad[3]:
            shape = [1 if i in batch_dims else q.shape[i] for i in (0, 1)]
            dbias = torch.empty(*shape, N, Nk, dtype=q.dtype, device=q.device)
        for s in range(0, N, step):
            rows = slice(s, s + step)
            # in place where possible: these (B, H, c, Nk) blocks are the whole cost
            prob = torch.matmul(q[:, :, rows], k_t).mul_(scale)
            probabilities_(prob.add_(full[:, :, rows]).sub_(lse[:, :, rows, None]))
            dv.add_(torch.matmul(prob.transpose(-2, -1), grad_out[:, :, rows]))
            dscore = torch.matmul(grad_out[:, :, rows], v_t)
            dscore.sub_(row_dot[:, :, rows]).mul_(prob)  # (B, H, c, Nk)
            dq[:, :, rows] = torch.matmul(dscore, k).mul_(scale)
            dk.add_(torch.matmul(dscore.transpose(-2, -1), q[:, :, rows]), alpha=scale)
            if dbias is not None and batch_dims:
                dbias[:, :, rows] = dscore.sum(dim=batch_dims, keepdim=True)
            elif dbias is not None:
                dbias[:, :, rows] = dscore
        if dbias is not None:
            dbias = reduce_to(dbias, bias.shape)
        return dq, dk, dv, dbias, None


def biased_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: float) -> Tensor:
    """``softmax(q k^T * scale + bias) v`` with ``bias`` ``(B|1, H|1, Nq|1, Nk|1)``, no dropout."""
    usable = (
        bias.requires_grad
        and q.device.type == "cpu"
        and torch.is_grad_enabled()
        and q.dtype in (torch.float32, torch.float64, torch.bfloat16)
        and bias.dtype == q.dtype
    )
    if not usable:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
    return _FlashBiasAttention.apply(q, k, v, bias, scale)

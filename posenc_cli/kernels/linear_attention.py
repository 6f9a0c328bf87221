"""Linear (kernelised) attention with relative position, in time linear or N log N in length.

Softmax attention's ``exp(q . k)`` is replaced by a feature map, ``phi(q) . phi(k)`` with
``phi(x) = elu(x) + 1`` (Katharopoulos et al. 2020), so the keys and values can be summed once
instead of per query. Two ways to put position back in, each against the dense equations in the
tests:

- ``rotary_linear_attention``: RoFormer's section 3.3 form (Su et al. 2021). The numerator turns
  the features by position, the denominator does not (so it stays positive):

      out_m = sum_n (R_m phi(q_m)) . (R_n phi(k_n)) v_n  /  sum_n phi(q_m) . phi(k_n)

- ``toeplitz_linear_attention``: Luo et al. 2021 ("Stable, Fast and Accurate: Kernelized
  Attention with Relative Positional Encoding"). A relative weight ``w_h(m - n)`` (``exp`` of a
  T5-, ALiBi- or KERPLE-style bias) multiplies every term:

      out_m = sum_n w(m - n) phi(q_m) . phi(k_n) v_n  /  sum_n w(m - n) phi(q_m) . phi(k_n)

  The sums over n are products with the Toeplitz matrix ``W[m, n] = w(m - n)``, done as a
  circular convolution of length 2N with the FFT: O(N log N) per feature channel.

Both take ``causal`` (keys up to the query only). Shapes: q, k ``(B, H, N, d)``, v
``(B, H, N, e)``. Causal rotary attention keeps running sums ``(B, H, N, d, e)``: memory
linear in N. Computations run in q's dtype; the FFT in float32 at least.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc_cli.kernels.rotary import rotary_tables, rotate_pairs

EPS = 1e-6  # keeps the denominator away from 0 for inputs whose features all vanish


def features(x: Tensor) -> Tensor:
    """``elu(x) + 1``: positive, so every weight ``phi(q) . phi(k)`` is."""
    return F.elu(x) + 1


def rotate_features(x: Tensor, positions: Tensor, inv_freq: Tensor) -> Tensor:
    """Turn channel pairs ``(2i, 2i + 1)`` of ``x`` ``(..., N, d)`` by ``position * inv_freq_i``."""
    return rotate_pairs(x, *rotary_tables(positions, inv_freq, x.dtype), "interleaved")


def rotary_linear_attention(
    q: Tensor, k: Tensor, v: Tensor, positions: Tensor, inv_freq: Tensor, causal: bool = False
) -> Tensor:
    fq, fk = features(q), features(k)
    rq, rk = rotate_features(fq, positions, inv_freq), rotate_features(fk, positions, inv_freq)
    if causal:
        kv = torch.einsum("bhnd,bhne->bhnde", rk, v).cumsum(2)  # (B, H, N, d, e)
        numerator = torch.einsum("bhnd,bhnde->bhne", rq, kv)
        denominator = (fq * fk.cumsum(2)).sum(-1, keepdim=True)
    else:
        numerator = rq @ (rk.transpose(-2, -1) @ v)  # (B, H, N, e)
        denominator = fq @ fk.sum(2, keepdim=True).transpose(-2, -1)  # (B, H, N, 1)
    return numerator / (denominator + EPS)


def toeplitz_apply(weights: Tensor, x: Tensor) -> Tensor:
    """``W @ x`` for the Toeplitz ``W[m, n] = weights[..., m - n + N - 1]``: ``weights``
    ``(H, 2N - 1)`` (offsets ``-(N-1) .. N-1``), ``x`` ``(B, H, N, c)``, by a length-2N FFT."""
    n = x.shape[-2]
    dtype = torch.promote_types(x.dtype, torch.float32)
    # the first column of the 2N circulant that holds W: offsets 0 .. N-1, a gap, then -(N-1) .. -1
    column = torch.cat(
        [
            weights[..., n - 1 :],
            weights.new_zeros(weights.shape[:-1] + (1,)),
            weights[..., : n - 1],
        ],
        dim=-1,
    ).to(dtype)  # (H, 2N)
    spectrum = torch.fft.rfft(column, n=2 * n)[None, :, :, None]  # (1, H, N + 1, 1)
    signal = torch.fft.rfft(x.to(dtype), n=2 * n, dim=-2)  # (B, H, N + 1, c)
    return torch.fft.irfft(spectrum * signal, n=2 * n, dim=-2)[..., :n, :].to(x.dtype)


def toeplitz_linear_attention(
    q: Tensor, k: Tensor, v: Tensor, weights: Tensor, causal: bool = False
) -> Tensor:
    """``weights`` ``(H, 2N - 1)``: ``w_h(m - n)`` for ``m - n = -(N-1) .. N-1``, positive."""
    n = q.shape[-2]
    if causal:  # a key after its query weighs nothing
        keep = torch.arange(-(n - 1), n, device=weights.device) >= 0
        weights = weights * keep
    fq, fk = features(q), features(k)
    d, e = fk.shape[-1], v.shape[-1]
    outer = (fk[..., :, None] * v[..., None, :]).flatten(-2)  # (B, H, N, d * e)
    summed = toeplitz_apply(weights, torch.cat([outer, fk], dim=-1))  # one FFT pass for both
    kv, ksum = summed[..., : d * e].unflatten(-1, (d, e)), summed[..., d * e :]
    numerator = torch.einsum("bhnd,bhnde->bhne", fq, kv)
    denominator = (fq * ksum).sum(-1, keepdim=True)
    return numerator / (denominator + EPS)

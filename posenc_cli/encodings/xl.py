"""Transformer-XL relative position encoding.

Dai, Yang, Yang, Carbonell, Le, Salakhutdinov 2019, "Transformer-XL: Attentive Language Models
Beyond a Fixed-Length Context", section 3.3. The score of query i against key j is

    A_ij = q_i . k_j              (a) content, computed by the attention module itself
         + q_i . W_R R_{i-j}      (b) content-dependent position
         + u . k_j                (c) global content bias
         + v . W_R R_{i-j}        (d) global position bias

all times the usual 1/sqrt(d). ``R_{i-j}`` is a fixed sinusoid of the distance over the model
dim, ``W_R`` a learned projection (no bias) to the heads, ``u`` and ``v`` learned ``(H, d)``
vectors. ``bias()`` returns (b) + (c) + (d), already scaled.

Conventions and deviations:
- Distance is query minus key, ``i - j`` (the paper's sign; T5 and Shaw use ``j - i``).
- Sinusoid layout: the reference code's ``[sin(x w_0..w_{D/2-1}) | cos(x w_0..w_{D/2-1})]`` with
  ``w_k = base^(-2k/D)``, not Vaswani's interleaved sin/cos columns. The two differ by a fixed
  permutation of columns, which ``W_R`` absorbs; the reference layout lets its checkpoints load.
  ``R_{-x}`` follows the same formula (sin halves change sign, cos halves do not).
- Causal (the paper's language model) only ever needs ``i - j >= 0``: only those distances are
  projected, and future pairs, which the attention mask removes anyway, read distance 0. The
  bidirectional (encoder) case, not in the paper, projects negative distances too.
- ``clamp_len`` (reference code option): distances are clipped to ``[-clamp_len, clamp_len]``
  before the sinusoid. None (default) clips nothing.
- Parameters live in every layer (``per_layer``): each layer owns ``W_R``, ``u`` and ``v``. The
  reference code projects with a per-layer ``W_R`` but by default ties ``u``, ``v`` across layers
  (``untie_r=False``); posenc keeps them per layer, as ``--untie_r`` does.
- Init: ``u``, ``v`` and ``W_R`` are normal with std 0.02, the reference code's default.
- Segment-level recurrence (memory): the attention module prepends ``memory`` to the keys; keys
  may be longer than queries and every pair gets its true distance. Stopping the gradient into
  the memory (the paper's SG) is the caller's job: pass ``memory.detach()``.
- Efficiency: (b) + (d) is ``(q + v) @ (W_R R)^T`` once per distinct distance,
  ``(B, H, Nq, n_dist)``, then read through the relative shift (consecutive positions) or
  gathered by distance id; (c) is ``(B, H, 1, Nk)`` broadcast. No ``(Nq, Nk, d)`` tensor is
  built. Asked block by block (``bias_by_block``), ``W_R R`` is projected once per call, and
  each block's gradient is formed by hand (``skewed``), not through the view's autograd.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc_cli.encodings.base import PositionEncoding
from posenc_cli.errors import UsageError
from posenc_cli.kernels.buckets import gather_buckets, table_products
from posenc_cli.kernels.positions import consecutive


def relative_sinusoid(distances: Tensor, dim: int, base: float = 10000.0) -> Tensor:
    """``R_x`` for each (any sign) distance x: ``(n, dim)`` float64, ``[sin | cos]`` halves."""
    freq = base ** -(torch.arange(0, dim, 2, dtype=torch.float64, device=distances.device) / dim)
    angle = distances.double()[:, None] * freq  # (n, dim/2)
    return torch.cat([angle.sin(), angle.cos()], dim=-1)  # (n, dim)


def distance_index(
    q_pos: Tensor, k_pos: Tensor, *, causal: bool = False, clamp_len: int | None = None
) -> tuple[Tensor, Tensor]:
    """Ids ``(Nq, Nk)`` of each pair's distance ``i - j`` into the distinct distances ``(n,)``.

    Causal keeps only ``i - j >= 0`` (future pairs read 0); ``clamp_len`` clips ``|i - j|``.
    """
    dist = q_pos[:, None] - k_pos[None, :]  # (Nq, Nk)
    low = 0 if causal else None
    high = None
    if clamp_len is not None:
        low = max(low, -clamp_len) if low is not None else -clamp_len
        high = clamp_len
    if low is not None or high is not None:
        dist = dist.clamp(min=low, max=high)
    lo, hi = (int(dist.min()), int(dist.max())) if dist.numel() else (0, 0)
    distances = torch.arange(lo, hi + 1, device=dist.device)  # (n,)
    return dist - lo, distances


def per_head_product(x: Tensor, r: Tensor) -> Tensor:
    """``x @ r^T`` per head, ``(B, H, rows, d)`` by ``(H, n, d)`` -> ``(B, H, rows, n)``, laid out
    head first. A broadcast matmul would copy ``r`` once per batch row (as large as the scores'
    fifth at d = 64); one bmm over the heads with the batch's rows stacked copies only ``x``. The
    last two dims are contiguous, which the relative shift's view needs."""
    B, H, rows, d = x.shape
    stacked = x.transpose(0, 1).reshape(H, B * rows, d)
    return torch.bmm(stacked, r.transpose(-2, -1)).view(H, B, rows, -1).transpose(0, 1)


def skewed(grad: Tensor, n: int) -> Tensor:
    """The gradient of ``(B, H, rows, n)`` scores through the relative shift: ``grad``'s entry
    ``(i, j)`` placed at ``(rows - 1 - i) + j`` of row i, zeros elsewhere (the distances a row
    does not read). Laid out head first, ``(H, B, rows, n)`` viewed as ``(B, H, rows, n)``, so the
    products with the distances' keys are single bmms over the heads."""
    B, H, rows, _ = grad.shape
    out = grad.new_zeros(H, B, rows, n)
    strides = (out.stride(1), out.stride(0), n - 1, 1)
    out.as_strided(grad.shape, strides, rows - 1).copy_(grad)
    return out.transpose(0, 1)


class TransformerXLRelative(PositionEncoding):
    """Transformer-XL's four-term relative score: ``W_R R_{i-j}`` with global biases u, v."""

    pairwise_content = True  # the (i, j) logit term reads q_i, k_j and positions only
    family = "relative"
    per_layer = True

    def __init__(
        self,
        *,
        base: float = 10000.0,
        clamp_len: int | None = None,
        dim: int = 512,
        heads: int = 8,
        head_dim: int = 64,
        causal: bool = False,
    ) -> None:
        super().__init__(heads=heads, head_dim=head_dim, causal=causal)
        if dim < 2 or dim % 2:
            raise UsageError(f"xl: dim must be even and >= 2 (sin and cos halves), got {dim}")
        if base <= 1:
            raise UsageError(f"xl: base must be > 1 (10000 in the paper), got {base}")
        if clamp_len is not None and clamp_len < 1:
            raise UsageError(
                f"xl: clamp_len must be >= 1, or None to clip nothing, got {clamp_len}"
            )
        self.dim = dim
        self.base = base
        self.clamp_len = clamp_len
        self.proj = nn.Linear(dim, heads * head_dim, bias=False)  # W_R (the paper's W_{k,R})
        self.u = nn.Parameter(torch.empty(heads, head_dim))  # global content bias
        self.v = nn.Parameter(torch.empty(heads, head_dim))  # global position bias
        for p in (self.proj.weight, self.u, self.v):
            nn.init.normal_(p, std=0.02)

    def shifted_position_term(self, qv: Tensor, q_pos: Tensor, k_pos: Tensor, r: Tensor) -> Tensor:
        """``(q + v) . W_R R_{i-j}`` over consecutive positions without a gather: ``(q + v) @ R``
        against the ``Nq + Nk - 1`` distances in falling order (``r``, ``(H, n, d)``, from
        ``falling_keys``), then read at a skewed stride, the relative shift of Transformer-XL's
        reference code as a view. Entry ``(i, j)`` sits at ``(Nq - 1 - i) + j`` of row i, so
        rows step by ``n - 1`` elements. Future pairs read negative distances here (the gather
        reads 0); the causal mask removes them either way."""
        nq, nk = len(q_pos), len(k_pos)
        scores = per_head_product(qv, r)  # (B, H, Nq, n), each (Nq, n) contiguous
        B, H, _, n = scores.shape
        return scores.as_strided(
            (B, H, nq, nk), (scores.stride(0), scores.stride(1), n - 1, 1),
            scores.storage_offset() + nq - 1,
        )  # fmt: skip

    def falling_keys(self, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype) -> tuple[Tensor, int]:
        """``W_R R_x`` for every distance the pairs span, the largest ``i - j`` first, ``(H, n,
        d)``, and that largest distance; a block's distances are a slice of it."""
        top = int(q_pos[-1] - k_pos[0])
        falling = torch.arange(top, top - (len(q_pos) + len(k_pos) - 1), -1, device=q_pos.device)
        return self.position_keys(falling).to(dtype), top

    def read_distances(self, qv: Tensor, q_pos: Tensor, k_pos: Tensor, r: Tensor, top: int):
        """``(q + v) . W_R R_{i-j}`` of every pair from ``r``, the keys of the distances falling
        from ``top`` (``falling_keys``): through the relative shift where both sides are
        consecutive, else gathered by distance (a band's global tokens beside its reach)."""
        nq, nk = len(q_pos), len(k_pos)
        if consecutive(q_pos) and consecutive(k_pos):
            first = top - int(q_pos[-1] - k_pos[0])
            return self.shifted_position_term(qv, q_pos, k_pos, r[:, first : first + nq + nk - 1])
        dist = q_pos[:, None] - k_pos[None, :]  # (Nq, Nk)
        high, low = int(dist.max()), int(dist.min())
        return gather_buckets(per_head_product(qv, r[:, top - high : top - low + 1]), high - dist)

    def bias_by_block(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor, causal=False):
        """Over consecutive positions ``W_R R`` is projected once for all blocks (per block it
        cost a ``(n, D) @ (D, H d)`` product forward, again in the backward and for its
        gradient): each block reads its slice of the distances."""
        if self.clamp_len is not None or not (consecutive(q_pos) and consecutive(k_pos)):
            return super().bias_by_block(q, k, q_pos, k_pos, causal)
        r, top = self.falling_keys(q_pos, k_pos, q.dtype)
        scale = self.logit_scale()

        def block(q_b: Tensor, k_b: Tensor, q_pos_b: Tensor, k_pos_b: Tensor) -> Tensor:
            qv = self.scaled_queries(q_b)
            return self.with_content(self.read_distances(qv, q_pos_b, k_pos_b, r, top), k_b)

        def add_grads(d_bias, q_b, k_b, q_pos_b, k_pos_b, d_rows, d_keys) -> list[Tensor]:
            # autograd would undo the relative shift through as_strided's backward, which zeroes
            # and scatters the whole storage; here dS goes into the skewed layout by one copy.
            # The logit scale goes on the (rows, d) and (n, d) products, not on every pair.
            B, H, rows, d = q_b.shape
            first = top - int(q_pos_b[-1] - k_pos_b[0])
            r_b = r.detach()[:, first : first + rows + len(k_pos_b) - 1]  # (H, n, d)
            n = r_b.shape[1]
            by_head = skewed(d_bias, n).transpose(0, 1).reshape(H, B * rows, n)  # a view
            qv = (q_b + self.v.detach().to(q_b.dtype)[None, :, None, :]).transpose(0, 1)
            d_qv = torch.bmm(by_head, r_b).mul_(scale).view(H, B, rows, d).transpose(0, 1)
            d_rows += d_qv
            d_r = torch.zeros_like(r)
            d_r[:, first : first + n] = torch.bmm(
                by_head.transpose(-2, -1), qv.reshape(H, B * rows, d)
            ).mul_(scale)  # fmt: skip
            per_key = d_bias.sum(-2).unsqueeze(-1) * scale  # (B, H, keys, 1): (c) is u . k_j
            d_keys += per_key * self.u.detach().to(k_b.dtype)[None, :, None, :]
            d_u = (per_key * k_b).sum((0, 2)).to(self.u.dtype)
            return [d_r, d_u, d_qv.sum((0, 2)).to(self.v.dtype)]

        block.add_grads = add_grads
        block.fresh = True  # a new tensor per call: the kernel may fold the mask in in place
        return block, [r, self.u, self.v], (q, k)

    def position_keys(self, distances: Tensor) -> Tensor:
        """``W_R R_x`` per head for each distance: ``(H, n, d)``."""
        r = relative_sinusoid(distances, self.dim, self.base).to(self.proj.weight.dtype)
        r = self.proj(r)  # (n, H*d)
        return r.view(len(distances), self.heads, self.head_dim).transpose(0, 1)  # (H, n, d)

    def bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        qv = self.scaled_queries(q)
        if self.clamp_len is None and consecutive(q_pos) and consecutive(k_pos):
            r, top = self.falling_keys(q_pos, k_pos, q.dtype)
            position = self.read_distances(qv, q_pos, k_pos, r, top)
        else:
            ids, distances = distance_index(
                q_pos, k_pos, causal=self.causal, clamp_len=self.clamp_len
            )
            r = self.position_keys(distances).to(q.dtype)  # (H, n, d)
            position = table_products(qv, r, ids)  # (B, H, Nq, Nk)
        return self.with_content(position, k)

    def scaled_queries(self, q: Tensor) -> Tensor:
        """``(q + v)`` times the logit scale, which is cheaper on ``(rows, d)`` than on every
        pair: what the distances' keys are multiplied by for (b) + (d)."""
        return (q + self.v.to(q.dtype)[None, :, None, :]) * self.logit_scale()

    def with_content(self, position: Tensor, k: Tensor) -> Tensor:
        """(b) + (d), ``position``, already scaled, plus (c), scaled: a new tensor."""
        u = self.u.to(k.dtype)[None, :, None, :] * self.logit_scale()  # (1, H, 1, d)
        content = (k @ u.transpose(-2, -1)).transpose(-2, -1)  # (c): (B, H, 1, Nk)
        return position + content

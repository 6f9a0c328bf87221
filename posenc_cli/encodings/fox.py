"""FoX, the Forgetting Transformer (Lin, Nikishin, He and Courville 2025, "Forgetting
Transformer: Softmax Attention with a Forget Gate", ICLR 2025).

Each head has a forget gate per token, ``f_l = sigmoid(w . x_l + b)``, and the logit of query i
on key j gains the log of everything forgotten in between:

    D_ij = sum_{l = j+1 .. i} log f_l = c_i - c_j,    c_l = sum_{t <= l} log f_t

a data-dependent decay that needs no other position encoding (the paper uses none).

Conventions:
- Causal only, as published.
- The gate reads the token's key, ``w_h . k_l + b_h`` per head, because the attention module
  hands the encoding q, k and v rather than the block's input x. ``k_l`` is a linear map of
  ``x_l``, so this is the paper's gate restricted to the head's key subspace (a deviation).
- ``log f`` is ``logsigmoid``, stable for any input. ``c`` is one prefix sum per head,
  ``(B, H, Nk)``; the bias ``c_i - c_j`` is the only logits-sized tensor it adds.
- ``b`` starts at 2 (gates near 0.88, little forgetting) and ``w`` at 0, per layer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc_cli.encodings.base import PositionEncoding
from posenc_cli.errors import UsageError


class ForgettingGate(PositionEncoding):
    """Adds ``sum_{l=j+1..i} log sigmoid(w . k_l + b)`` per head."""

    family = "bias"
    reads_positions = False
    causal_only = True
    per_layer = True

    def __init__(self, *, heads: int = 8, head_dim: int = 64, causal: bool = False) -> None:
        super().__init__(heads=heads, head_dim=head_dim, causal=causal)
        if not causal:
            raise UsageError(
                "fox: the forget gate decays towards the past, so it is causal only; use it "
                "with a language-model task"
            )
        self.weight = nn.Parameter(torch.zeros(heads, head_dim))
        self.offset = nn.Parameter(torch.full((heads,), 2.0))

    def extra_repr(self) -> str:
        return f"heads={self.heads}"

    def forgotten(self, k: Tensor) -> Tensor:
        """``c_l``, the prefix sum of log forget gates per head, ``(B, H, Nk)``."""
        w, b = self.weight.to(k.dtype), self.offset.to(k.dtype)
        log_f = F.logsigmoid((k * w[None, :, None, :]).sum(-1) + b[None, :, None])  # (B, H, Nk)
        return log_f.cumsum(-1)

    def attend(self, q, k, v, q_pos, k_pos, scale, causal, key_mask=None) -> Tensor | None:
        """``c_i - c_j``: the ``c_i`` of the query is one constant per softmax row, which softmax
        ignores, so only ``-c_j``, one number per key, is left. Carried as one more channel of
        q (``1 / scale``) and k (``-c_j``), the whole bias rides inside SDPA's own causal kernel:
        no (B, H, N, N) tensor, and the upper triangle skipped. Exact up to rounding of the
        logits (``|c|`` grows about linearly with N). Square self-attention only: SDPA's
        ``is_causal`` aligns the mask top-left, which is wrong once keys outnumber queries."""
        if (
            key_mask is not None
            or not causal
            or q.shape[-2] != k.shape[-2]
            or q.dtype not in (torch.float32, torch.float64)
        ):
            return None
        c = self.forgotten(k)  # (B, H, N)
        ones = torch.full_like(q[..., :1], 1.0 / scale)
        q_plus = torch.cat([q, ones], dim=-1)
        k_plus = torch.cat([k, -c[..., None]], dim=-1)
        v_plus = F.pad(v, (0, 1))  # SDPA's CPU flash kernel wants one head width for q, k, v
        out = F.scaled_dot_product_attention(q_plus, k_plus, v_plus, is_causal=True, scale=scale)
        return out[..., :-1]

    def bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        c = self.forgotten(k)  # (B, H, Nk)
        c_q = c[..., c.shape[-1] - q.shape[-2] :]  # the queries are the last keys
        return c_q[..., :, None] - c[..., None, :]  # (B, H, Nq, Nk); above the diagonal: masked

"""The one attention module. It knows no encoding by name; it calls the encoding's hooks.

Paths:
- fused: ``F.scaled_dot_product_attention`` with the encoding's bias (if any) and the masks as
  ``attn_mask``. Taken whenever the encoding has no value-side term.
- manual: softmax(q k^T * scale + bias) computed explicitly, because a value-side term
  (Shaw's a^V) needs the attention weights.
- the encoding's own: an encoding may compute the whole attention itself (``attend``; Shaw's
  and T5's clipped terms on the flash kernel), asked first when there is no key mask and no
  dropout.
- blocked: a content-free bias (``content_free``) on long inputs is asked of the encoding one
  block of queries at a time (``kernels/blocked_bias.py``): memory linear in N, and under a
  causal mask each block sees only its keys, as the kernel's own ``is_causal`` does.
- flex (CUDA): a content-free bias as a FlexAttention score_mod and the causal or window mask
  as a block mask (``kernels/flex.py``), compiled once per shape; no (H, N, N) tensor.
- linear (``form="linear"``): kernelised attention in O(N) or O(N log N), the position kept
  as rotation or as a relative weight (``models/linear_form.py``).
- window: with ``window=k`` on an image grid, each patch attends to its k x k neighbourhood and
  the prefix tokens (``models/window.py``), O(N k^2 d) instead of O(N^2 d); ``dilation`` spaces
  the slots, ``stride`` adds a k x k lattice of slots that far apart (Child et al.'s strided
  pattern), ``global_tokens`` makes the first patches global (BigBird, Longformer). On a 1D
  sequence the same options give the same pattern on one axis (``kernels/visibility.py``), run
  by the blocked kernel, each block of queries seeing only the keys in its reach: O(N k d).

Under a causal mask, padding on the right is already hidden from every real query, so a key mask
of that shape is dropped and the paths above that take none serve (length-generalisation batches
are about half padding).

Keys may be longer than queries: ``memory`` (the previous segment's hidden states, as in
Transformer-XL) is prepended to the keys and values, and the queries are the last positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc_cli.encodings.absolute import NoPosition
from posenc_cli.encodings.base import PositionEncoding, grid_shape
from posenc_cli.errors import UsageError
from posenc_cli.kernels import blocked_bias, flex
from posenc_cli.kernels.biased_sdpa import EXPLICIT_MAX_PAIRS, biased_attention
from posenc_cli.kernels.grid_bias import GridTable
from posenc_cli.kernels.positions import (
    consecutive,
    increasing,
    padded_on_the_right,
    row_major_grid,
)
from posenc_cli.kernels.positions import dense as dense_positions
from posenc_cli.kernels.visibility import Band, Visibility
from posenc_cli.models import flex_path, linear_form
from posenc_cli.models.window import (
    check_global,
    check_grid_global,
    check_pattern,
    window_attention,
)


def attention_mask(
    q_pos: Tensor, k_pos: Tensor, causal: bool, key_mask: Tensor | None
) -> Tensor | None:
    """Boolean mask, True where query i may attend key j: ``(B|1, 1, Nq, Nk)`` or None."""
    mask = None
    if causal:
        mask = (k_pos[None, :] <= q_pos[:, None])[None, None]  # (1, 1, Nq, Nk)
    if key_mask is not None:
        keys = key_mask[:, None, None, :].bool()  # (B, 1, 1, Nk)
        mask = keys if mask is None else mask & keys
    return mask


class Attention(nn.Module):
    """Multi-head self-attention consulting a position encoding through its hooks."""

    def __init__(
        self,
        dim: int,
        heads: int,
        encoding: PositionEncoding | None = None,
        causal: bool = False,
        dropout: float = 0.0,
        qkv_bias: bool = True,
        window: int | None = None,
        dilation: int = 1,
        form: str = "softmax",
        stride: int | None = None,
        global_tokens: int = 0,
    ) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not divisible by heads {heads}")
        check_pattern(window, dilation, stride, global_tokens)
        if form not in ("softmax", "linear"):
            raise UsageError(f"attention must be 'softmax' or 'linear', got {form!r}")
        if form == "linear" and window is not None:
            raise UsageError("linear attention has no window: drop one of the two")
        self.window = window
        self.dilation = dilation
        self.stride = stride  # None: no strided lattice
        self.global_tokens = global_tokens  # patches that are global, beside the prefix
        self.form = form
        self.heads = heads
        self.head_dim = dim // heads
        self.causal = causal
        self.dropout = dropout
        if encoding is None:
            encoding = NoPosition(heads=heads, head_dim=self.head_dim)
        self.encoding = encoding
        shape = (self.encoding.heads, self.encoding.head_dim)
        if shape != (heads, self.head_dim):
            # the encoding's tables and its logit scale were built for its own head shape
            raise ValueError(
                f"encoding was built for heads={shape[0]}, head_dim={shape[1]} but the attention "
                f"has heads={heads}, head_dim={self.head_dim}; build both from the same numbers"
            )
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, 2 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    @property
    def band(self) -> Band | None:
        """The sparse pattern on a 1D sequence (an image grid reads the same four numbers)."""
        if self.window is None:
            return None
        return Band(self.window, self.dilation, self.stride, self.global_tokens)

    @property
    def no_logit_term(self) -> bool:
        """Whether the encoding adds nothing to the logits (no position, absolute or rotary):
        under a mask it needs no bias at all."""
        return self.encoding.family in ("none", "absolute", "rotary")

    def split_heads(self, x: Tensor) -> Tensor:
        B, N, _ = x.shape
        return x.view(B, N, self.heads, self.head_dim).transpose(1, 2)  # (B, H, N, d)

    def merge_heads(self, out: Tensor) -> Tensor:
        """``(B, H, N, d)`` head outputs -> ``(B, N, D)`` through the output projection."""
        B, H, N, d = out.shape
        return self.proj(out.transpose(1, 2).reshape(B, N, H * d))

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        key_mask: Tensor | None = None,
        offset: int = 0,
        positions: Tensor | None = None,
    ) -> Tensor:
        """``x`` (B, N, D); ``memory`` (B, M, D) or None; ``key_mask`` (B, M+N) True = real token
        (under a causal mask, right padding leaves the outputs of padded queries undefined);
        ``offset`` shifts every 1D position (cached decoding, translation tests); ``positions``
        gives the keys' positions explicitly, ``(M+N,)`` or ``(M+N, 2)`` for an image grid."""
        context = x if memory is None else torch.cat([memory, x], dim=1)
        B, N, D = x.shape
        Nk = context.shape[1]
        if positions is None:
            k_pos = torch.arange(offset, offset + Nk, device=x.device)
        else:
            k_pos = positions.to(x.device)
            if len(k_pos) != Nk:
                raise ValueError(f"positions cover {len(k_pos)} tokens, the keys are {Nk}")
        q_pos = k_pos[Nk - N :]

        if k_pos.dim() > 1 and self.causal:
            raise ValueError("a causal mask needs 1D positions; image grids are not causal")
        if key_mask is not None and self.hides_padding(key_mask, memory, k_pos):
            # no query that is read sees a padded key anyway: the fast causal paths serve
            key_mask = None
        q, kv = self.q(x), self.kv(context)
        added = self.encoding.qk_input(k_pos)  # (Nk, D) or None
        if added is not None:
            # W(x + p) = W x + W p: add the projected embedding to q and k, leave v alone
            added = added.to(x.dtype)
            q = q + F.linear(added[Nk - N :], self.q.weight)
            kv = kv + F.pad(F.linear(added, self.kv.weight[:D]), (0, D))
        q = self.split_heads(q)
        k, v = (self.split_heads(t) for t in kv.chunk(2, dim=-1))
        if self.form == "linear":
            if memory is not None or key_mask is not None or k_pos.dim() != 1:
                raise UsageError(
                    "linear attention runs on plain 1D sequences: no memory, key mask or grid"
                )
            return self.merge_heads(linear_form.attend(self.encoding, q, k, v, k_pos, self.causal))
        q, k = self.encoding.rotate(q, k, q_pos, k_pos)
        scale = self.encoding.logit_scale()
        drop = self.dropout if self.training else 0.0
        if q.is_cuda and key_mask is None and drop == 0.0 and self.flex_serves(memory, k_pos):
            return self.merge_heads(self.flex(q, k, v, q_pos, k_pos, scale))
        if self.window is not None and k_pos.dim() == 1:
            if memory is not None:
                raise UsageError("window attention takes no memory: set mem_len to 0")
            return self.merge_heads(self.banded(q, k, v, q_pos, k_pos, scale, key_mask, drop))
        if self.window is not None:
            if memory is not None or key_mask is not None or k_pos.dim() != 2:
                raise UsageError(
                    "window attention needs a sequence or an image grid "
                    "(positions=grid_positions(...)) and takes no memory or key mask"
                )
            out = window_attention(
                q, k, v, self.encoding, k_pos, self.window, scale, self.dilation, self.stride,
                self.global_tokens,
            )  # fmt: skip
            return self.merge_heads(out)

        if drop == 0.0:
            out = self.encoding.attend(q, k, v, q_pos, k_pos, scale, self.causal, key_mask)
            if out is not None:
                return self.merge_heads(out)
        if key_mask is None and drop == 0.0:
            # content-dependent terms pay off block by block only under a causal mask (half the
            # square): without one, XL measured 3.35x of none against 2.98x on the dense path
            pairwise = self.encoding.pairwise_content and self.causal
            blockwise = self.encoding.content_free or pairwise
            if blockwise and blocked_bias.worth(q, k, self.causal):
                return self.merge_heads(self.blocked(q, k, v, q_pos, k_pos, scale))
        return self.merge_heads(self.dense(q, k, v, q_pos, k_pos, scale, key_mask, drop))

    def hides_padding(self, key_mask: Tensor, memory: Tensor | None, k_pos: Tensor) -> bool:
        """Whether the causal mask alone keeps every real query off the padding: padding on the
        right, positions increasing. The padded queries then see keys they did not see with
        the key mask, but nothing reads their outputs (the loss ignores them, and they reach
        later layers only as padded keys)."""
        if not self.causal or memory is not None or self.form == "linear":
            return False
        return increasing(k_pos) and padded_on_the_right(key_mask)

    def dense(self, q, k, v, q_pos, k_pos, scale, key_mask, drop, hidden=None) -> Tensor:
        """The whole ``(B|1, H, Nq, Nk)`` bias at once, on the fused kernel or explicitly;
        ``hidden`` ``(Nq, Nk)``: pairs a sparse pattern masks beside the causal and key masks."""
        N, Nk = q.shape[-2], k.shape[-2]
        bias = self.encoding.visible_bias(q, k, q_pos, k_pos, self.causal)  # (B|1, H, N, Nk)
        mask = attention_mask(q_pos, k_pos, self.causal, key_mask)
        if hidden is not None:
            mask = ~hidden[None, None] if mask is None else mask & ~hidden
        small = N * Nk <= EXPLICIT_MAX_PAIRS and bias is not None and bias.requires_grad
        if self.encoding.uses_value or small:
            return self.manual(q, k, v, bias, mask, scale, drop, q_pos, k_pos)
        plain_causal = self.causal and key_mask is None and N == Nk and hidden is None
        return self.fused(q, k, v, bias, mask, scale, drop, plain_causal)

    def banded(self, q, k, v, q_pos, k_pos, scale, key_mask, drop) -> Tensor:
        """Window attention on a sequence: the blocked kernel, each block of queries seeing only
        the keys its band reaches, wherever the encoding's terms allow it (no value term; a bias
        of the positions, or of the pair's own q and k, or none); else the dense path under the
        pattern's mask, O(N^2) for the same numbers."""
        check_global(self.global_tokens, len(k_pos), "tokens of the sequence")
        encoding = self.encoding
        plain = self.no_logit_term
        terms = plain or encoding.content_free or encoding.pairwise_content
        terms = terms and not encoding.uses_value
        # the CPU flash kernel in float32/64, with one head width (PoPE's q and k are wider)
        fits = q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64)
        fits = fits and q.shape[-1] == v.shape[-1]
        if terms and fits and key_mask is None and drop == 0.0 and consecutive(k_pos):
            return self.blocked(q, k, v, q_pos, k_pos, scale, plain)
        hidden = Visibility(False, self.band, int(k_pos[0])).hidden(q_pos, k_pos)
        return self.dense(q, k, v, q_pos, k_pos, scale, key_mask, drop, hidden)

    def flex_serves(self, memory, k_pos) -> bool:
        """Whether the GPU path covers this call: a content-free bias (or, in window attention
        on a grid, no position term in the logits at all)."""
        if self.window is not None:
            if k_pos.dim() == 1 and self.encoding.toeplitz:
                return memory is None and dense_positions(k_pos)
            return memory is None and (self.encoding.content_free or self.no_logit_term)
        if self.encoding.toeplitz and k_pos.dim() == 1:  # its score_mod reads a distance table
            return dense_positions(k_pos)
        return self.encoding.content_free

    def flex(self, q, k, v, q_pos, k_pos, scale) -> Tensor:
        """FlexAttention: the bias as a score_mod, the causal or window mask as a block mask."""
        mod = flex_path.score_mod_for(self.encoding, q, q_pos, k_pos) if (
            self.encoding.content_free
        ) else None  # fmt: skip
        mask, pattern = None, None
        if self.window is not None and k_pos.dim() == 1:
            seen = Visibility(self.causal, self.band, int(k_pos[0]))
            mask, pattern = flex.band_mask(seen, q_pos, k_pos), ("band", seen)
        elif self.window is not None:
            check_grid_global(self.global_tokens, *grid_shape(k_pos)[:2])
            grid = (self.window, self.dilation, self.stride, self.global_tokens)
            mask, pattern = flex.window_mask(k_pos, *grid), ("window", *grid)
        elif self.causal:
            mask, pattern = flex.causal_mask(q_pos, k_pos), ("causal",)
        key = None
        if mask is not None:
            key = (pattern, flex.positions_key(q_pos), flex.positions_key(k_pos))
        return flex.attention(q, k, v, mod, mask, scale, key)

    def blocked(self, q, k, v, q_pos, k_pos, scale, plain: bool = False) -> Tensor:
        """A bias asked for one block of queries at a time: never the whole ``(H, Nq, Nk)``
        tensor, and under a causal mask or a band only the keys each block sees. Content-free
        biases come from the positions alone; ``pairwise_content`` ones from the block's own q
        and k (or what ``bias_by_block`` makes of them); ``plain`` (no bias at all, under a band)
        is a table of zeros the band masks."""
        encoding = self.encoding
        bias_of_block = encoding.bias  # asked with the block's own q and k
        learned = [p for p in encoding.parameters() if p.requires_grad]
        reads = None  # what a content-dependent bias reads rows and keys of
        if plain:
            low = int(k_pos[0] - q_pos[-1])
            zeros = q.new_zeros(1, int(k_pos[-1] - q_pos[0]) - low + 1)
            bias_of_block, learned = blocked_bias.DistanceTable(zeros, low), []
        elif encoding.pairwise_content:
            bias_of_block, learned, reads = encoding.bias_by_block(
                q, k, q_pos, k_pos, causal=self.causal
            )
        elif encoding.toeplitz and dense_positions(k_pos):
            table, low = encoding.distance_table(q, q_pos, k_pos)
            bias_of_block = blocked_bias.DistanceTable(table, low)
            learned = [table] if table.requires_grad else []
        elif encoding.toeplitz and (layout := row_major_grid(k_pos)) is not None:
            # an image's patches: the kernel reads the bias as views where GridTable.serves
            bias_of_block = GridTable(encoding.bias, q, k_pos, layout)
        return blocked_bias.blocked_bias_attention(
            q, k, v, q_pos, k_pos, bias_of_block, learned, scale, self.causal, reads=reads,
            band=self.band,
        )  # fmt: skip

    def fused(self, q, k, v, bias, mask, scale, drop, plain_causal) -> Tensor:
        if bias is None and plain_causal:
            # pure causal: let the kernel build the mask itself
            return F.scaled_dot_product_attention(
                q, k, v, dropout_p=drop, is_causal=True, scale=scale
            )
        if bias is not None:
            bias = bias.to(q.dtype)
            if mask is not None:
                bias = bias.masked_fill(~mask, torch.finfo(bias.dtype).min)
            if drop == 0.0:
                return biased_attention(q, k, v, bias, scale)
            mask = bias
        elif mask is not None:
            # additive rather than boolean: a fully masked row (left padding under a causal
            # mask) then gives a uniform row instead of NaN
            mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(
                ~mask, torch.finfo(q.dtype).min
            )
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop, scale=scale)

    def manual(self, q, k, v, bias, mask, scale, drop, q_pos, k_pos) -> Tensor:
        B, H, N, d = q.shape
        Nk = k.shape[-2]
        if bias is not None and bias.shape == (B, H, N, Nk):
            # bias + scale * q k^T in one pass (a content-dependent bias is already full size)
            flat = torch.baddbmm(
                bias.reshape(B * H, N, Nk),
                q.reshape(B * H, N, d),
                k.reshape(B * H, Nk, d).transpose(-2, -1),
                alpha=scale,
            )
            logits = flat.view(B, H, N, Nk)
        else:
            logits = (q @ k.transpose(-2, -1)) * scale  # (B, H, N, Nk)
            if bias is not None:
                logits = logits + bias
        if mask is not None:
            logits = logits.masked_fill(~mask, torch.finfo(logits.dtype).min)
        attn = logits.softmax(dim=-1)
        attn = F.dropout(attn, drop, self.training)
        out = attn @ v
        extra = self.encoding.value(attn, q_pos, k_pos)
        return out if extra is None else out + extra

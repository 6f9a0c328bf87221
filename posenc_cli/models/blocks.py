"""The pre-norm Transformer block shared by the text and image models.

``x + attn(LN(x))`` then ``x + mlp(LN(x))`` (GPT-2 / ViT order). Position information reaches the
block only through the encoding that its ``Attention`` consults.

Segment memory (Transformer-XL, Dai et al. 2019, section 3.2): a block's memory is its own *input*
from earlier segments, stored before the LayerNorm and normalised again by the block's current
LayerNorm when read (LayerNorm acts per token, so ``LN([mem; x]) = [LN(mem); LN(x)]``: reading
the memory gives exactly the keys a single longer run would have given). The new memory is the last
``mem_len`` positions of ``[old memory; block input]``, detached (the paper's stop-gradient).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc_cli.encodings.base import PositionEncoding
from posenc_cli.models.attention import Attention


def next_memory(memory: Tensor | None, x: Tensor, mem_len: int) -> Tensor:
    """The last ``mem_len`` positions of ``[memory; x]``, detached: (B, min(mem_len, M+N), D)."""
    states = x if memory is None else torch.cat([memory.to(x.dtype), x], dim=1)  # (B, M+N, D)
    return states[:, max(states.shape[1] - mem_len, 0) :].detach()


class MLP(nn.Module):
    """Position-wise feed-forward: Linear, GELU, Linear."""

    def __init__(self, dim: int, hidden: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.fc2(self.act(self.fc1(x))))


class TransformerBlock(nn.Module):
    """Pre-norm block: LayerNorm, attention (with ``encoding``), residual; LayerNorm, MLP, residual.

    ``dropout`` applies to the attention weights and to both residual branches. ``window``
    and its ``dilation``, ``stride`` and ``global_tokens`` pass through to ``Attention`` (sparse
    patterns on image grids and sequences).
    """

    def __init__(
        self,
        dim: int,
        heads: int,
        encoding: PositionEncoding | None = None,
        causal: bool = False,
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        *,
        window: int | None = None,
        form: str = "softmax",
        dilation: int = 1,
        stride: int | None = None,
        global_tokens: int = 0,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(
            dim, heads, encoding, causal=causal, dropout=dropout, window=window, form=form,
            dilation=dilation, stride=stride, global_tokens=global_tokens,
        )  # fmt: skip
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim, max(1, round(dim * mlp_ratio)), dropout)
        self.drop = nn.Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        key_mask: Tensor | None = None,
        offset: int = 0,
        positions: Tensor | None = None,
        mem_len: int = 0,
    ) -> tuple[Tensor, Tensor | None]:
        """``x`` (B, N, D); ``memory`` (B, M, D): this block's inputs from earlier segments;
        ``key_mask`` (B, M+N); ``offset``/``positions`` as in ``Attention``.

        Returns the block's output (B, N, D) and, when ``mem_len > 0``, the memory the next segment
        needs (``next_memory(memory, x, mem_len)``), else None.
        """
        context = None if memory is None else self.norm1(memory.to(x.dtype))
        attended = self.attn(
            self.norm1(x), memory=context, key_mask=key_mask, offset=offset, positions=positions
        )
        out = x + self.drop(attended)
        out = self.feed_forward(out, key_mask if memory is None and mem_len == 0 else None)
        new_memory = next_memory(memory, x, mem_len) if mem_len > 0 else None
        return out, new_memory

    def feed_forward(self, x: Tensor, key_mask: Tensor | None) -> Tensor:
        """``x + mlp(LN(x))``, on the real tokens only when ``key_mask`` marks padding.

        A padded token's state is never read: every attention hides it as a key, the loss ignores
        it and pooling skips it. So it may keep its state unchanged, and a training batch of mixed
        lengths (half padding on length generalisation tasks) skips the MLP's work on it."""
        if key_mask is None:
            return x + self.mlp(self.norm2(x))  # the MLP ends in its own dropout
        B, N, D = x.shape
        flat = x.reshape(B * N, D)
        rows = key_mask.reshape(-1).nonzero().squeeze(1)
        return flat.index_add(0, rows, self.mlp(self.norm2(flat[rows]))).view(B, N, D)

"""timm's ViT block with posenc's ``Attention`` in place of timm's, fed explicit token positions.

The adapter between ``timm.models.vision_transformer.VisionTransformer`` and posenc: timm builds
every block through ``block_fn``; ``PositionBlock`` is timm's own ``Block`` (its norms, MLP,
LayerScale and drop path) whose ``attn`` is posenc's ``Attention``, the one module that consults
a position encoding's hooks. Its ``forward`` takes the token positions that the model computes
once per forward pass, so nothing about positions is stored between calls.

Conventions:

- timm's ``Attention`` has one ``qkv`` linear (dim -> 3 dim); posenc's has ``q`` (dim -> dim) and
  ``kv`` (dim -> 2 dim): the same weights split in two, so parameter count, FLOPs and timm's
  init (truncated normal std 0.02 on every Linear) are unchanged.
- timm's ``proj_drop`` (dropout on the attention output) is applied here after the attention;
  ``attn_drop`` is posenc's ``dropout`` on the attention weights.
- Options that posenc's attention lacks (``qk_norm``, ``scale_attn_norm``, ``proj_bias=False``)
  are refused rather than silently ignored.
- ``encodings[depth]`` is the block's encoding: the model passes the same shared instance at
  every depth, or one instance per depth for ``per_layer`` encodings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from timm.models.vision_transformer import Block
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint as recompute

from posenc_cli.encodings.base import PositionEncoding
from posenc_cli.errors import UsageError
from posenc_cli.models.attention import Attention


class PositionBlock(Block):
    """timm's pre-norm ViT block; its attention is posenc's ``Attention`` with ``encoding``."""

    def __init__(
        self,
        *,
        encodings: Sequence[PositionEncoding],
        window: int | None = None,
        window_dilation: int = 1,
        window_stride: int | None = None,
        window_global: int = 0,
        dim: int,
        num_heads: int,
        qkv_bias: bool = True,
        qk_norm: bool = False,
        scale_attn_norm: bool = False,
        proj_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        depth: int = 0,
        **block_args: Any,
    ) -> None:
        if qk_norm or scale_attn_norm or not proj_bias:
            raise UsageError(
                "posenc's ViT attention has no qk_norm / scale_attn_norm and always a proj bias; "
                "leave those timm options at their defaults"
            )
        block_args.pop("attn_layer", None)
        # nn.Identity accepts and ignores timm's attention arguments: a placeholder that costs
        # nothing, replaced by posenc's attention below.
        super().__init__(
            dim=dim,
            num_heads=num_heads,
            qkv_bias=qkv_bias,
            proj_bias=proj_bias,
            attn_drop=attn_drop,
            proj_drop=proj_drop,
            attn_layer=nn.Identity,
            depth=depth,
            **block_args,
        )
        self.attn = Attention(
            dim, num_heads, encodings[depth], dropout=attn_drop, qkv_bias=qkv_bias, window=window,
            dilation=window_dilation, stride=window_stride, global_tokens=window_global,
        )  # fmt: skip
        self.attn_out_drop = nn.Dropout(proj_drop)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:  # type: ignore[override]
        """``x`` (B, N, D); ``positions`` ``(N,)`` or ``(N, 2)`` as ``Attention`` takes them."""
        attended = self.attn_out_drop(self.attn(self.norm1(x), positions=positions))
        x = x + self.drop_path1(self.ls1(attended))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


def run_blocks(
    blocks: Sequence[nn.Module], x: Tensor, positions: Tensor, checkpoint: bool
) -> Tensor:
    """Every block in turn; with ``checkpoint`` each block's activations are recomputed in the
    backward pass (timm's ``set_grad_checkpointing``)."""
    for block in blocks:
        if checkpoint and torch.is_grad_enabled():
            x = recompute(block, x, positions, use_reentrant=False)
        else:
            x = block(x, positions)
    return x

"""DETR-lite: a small DETR whose encoder self-attention takes any 2D encoding of the registry.

Carion et al. 2020, "End-to-End Object Detection with Transformers" (DETR). A ResNet backbone
(``backbone.py``) and a 1x1 convolution give a ``h x w`` grid of ``dim``-wide tokens; a
Transformer encoder mixes them; a decoder turns ``num_queries`` learned object queries into
``num_queries`` predictions (class logits over ``num_classes + 1``, the last being "no object",
and a normalised ``(cx, cy, w, h)`` box), after every decoder layer (auxiliary losses).

Two independent position settings, so that each published configuration is one pair:

- ``sine``: DETR's own fixed 2D sinusoid (``encodings/sincos2d.py``, normalised, temperature
  10000) added to the query and key inputs of every encoder self-attention (not to the values)
  and to the keys of every decoder cross-attention, as DETR does.
- ``encoding``: a registry encoding (``none``, ``sincos2d``, ``learned2d``, ``rope2d``, ``swin``,
  ``irpe``) consulted by the encoder self-attention through posenc's hooks, on grid positions
  ``grid_positions(h, w)``; one instance per layer when its class says ``per_layer``. Absolute
  encodings (``learned2d``, ``sincos2d`` with ``where="input"``) are added once to the encoder
  input. Tables sized by grid (``learned2d``, ``swin``) default to the grid of an
  ``image_size`` image; ``learned2d`` defaults to no prefix token (DETR has none).

The configurations of the DETR/iRPE comparison (``SETTINGS``):

    ============== ====== ========  =========================================================
    name           sine   encoding  meaning
    ============== ====== ========  =========================================================
    none           False  none      no position anywhere (DETR's ablation: 39.5 -> 32.8 AP)
    sincos2d       True   none      DETR's own setting
    sincos2d+irpe  True   irpe      iRPE in encoder self-attention, DETR's sine kept (Wu et al.)
    rope2d         False  rope2d    RoPE-ViT in encoder self-attention, nothing else
    ============== ====== ========  =========================================================

``sine=True`` with ``encoding="sincos2d"`` would add the same sinusoid twice and is an error.

Deviations from DETR, each for a small, fast model:

- Pre-norm layers (``x + f(LN(x))``, posenc's ``TransformerBlock`` in the encoder) with a final
  LayerNorm after the encoder and after every decoder layer, which is DETR's
  ``normalize_before=True`` variant; DETR's default is post-norm. With pre-norm the sine is
  added to ``LN(x)``: ``q = k = LN(x) + pos``, ``v = LN(x)``.
- The feed-forward layers use GELU (posenc's ``MLP``) where DETR uses ReLU; the box head keeps
  ReLU. Parameters keep PyTorch's default initialisation (DETR re-initialises every matrix with
  Xavier, which would also overwrite the encodings' own initialisations).
- No padding mask: a batch holds images of one size (any size; the grid follows the feature map).
- The decoder starts from zeros and the learned query embeddings are the query positions, added
  to the queries and keys of self-attention and the queries of cross-attention, as in DETR.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from posenc_cli.encodings import ENCODINGS, build_encoding, refuse_dims, user_params
from posenc_cli.encodings.base import (
    BackboneFacts,
    PositionEncoding,
    WrappedEncoding,
    grid_positions,
)
from posenc_cli.encodings.sincos2d import SinCos2D
from posenc_cli.errors import UsageError
from posenc_cli.models.blocks import MLP, TransformerBlock
from posenc_cli.params import close_match, convert, signature_params
from posenc_cli.tasks.detection.backbone import Backbone, BackboneName, Norm, Stride

# (sine, encoding) of the configurations compared in the DETR + iRPE experiment
SETTINGS: dict[str, tuple[bool, str]] = {
    "none": (False, "none"),
    "sincos2d": (True, "none"),
    "sincos2d+irpe": (True, "irpe"),
    "rope2d": (False, "rope2d"),
}


class SineQK(WrappedEncoding):
    """DETR's sine on the q/k inputs around another encoding, in one attention: ``qk_input``
    is the sine (plus the inner encoding's own, if any); every other hook is the inner one's."""

    dims = 2

    def __init__(self, sine: SinCos2D, inner: PositionEncoding) -> None:
        super().__init__(inner)
        self.sine = sine

    def qk_input(self, positions: Tensor) -> Tensor | None:
        table = self.sine.table(positions)  # (N, D), float64
        other = self.inner.qk_input(positions)
        return table if other is None else table + other


class DecoderLayer(nn.Module):
    """Pre-norm DETR decoder layer: self-attention over the queries, cross-attention to the
    encoder memory, MLP. Positions are added to queries and keys, never to values."""

    def __init__(self, dim: int, heads: int, hidden: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.self_attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.cross_attn = nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True)
        self.norm3 = nn.LayerNorm(dim)
        self.mlp = MLP(dim, hidden, dropout)
        self.drop = nn.Dropout(dropout)

    def forward(
        self, tgt: Tensor, memory: Tensor, query_pos: Tensor, memory_pos: Tensor | None
    ) -> Tensor:
        """``tgt`` (B, Q, D), ``memory`` (B, N, D), ``query_pos`` (1|B, Q, D), ``memory_pos``
        (N, D) or None -> (B, Q, D)."""
        h = self.norm1(tgt)
        q = h + query_pos
        tgt = tgt + self.drop(self.self_attn(q, q, h, need_weights=False)[0])
        h = self.norm2(tgt)
        keys = memory if memory_pos is None else memory + memory_pos
        tgt = tgt + self.drop(self.cross_attn(h + query_pos, keys, memory, need_weights=False)[0])
        return tgt + self.mlp(self.norm3(tgt))


class BoxHead(nn.Module):
    """DETR's box head: three linear layers with ReLU between, then a sigmoid: ``(..., D) ->
    (..., 4)`` normalised ``(cx, cy, w, h)``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, 4)
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x).sigmoid()


def encoder_encodings(
    name: str,
    params: dict[str, Any],
    layers: int,
    dim: int,
    heads: int,
    grid: int,
    sine: SinCos2D | None,
) -> list[PositionEncoding]:
    """One encoding per encoder layer (the same instance for shared ones), wrapped with the sine
    when ``sine`` is given. Grid-sized tables default to a ``grid x grid`` feature map."""
    if name in ENCODINGS:  # an unknown name is answered by user_params below
        refuse_dims(name, (2,), "DETR-lite", also=("none",))
    if sine is not None and name == "sincos2d":
        raise UsageError(
            "model.sine=true already adds DETR's sine to q/k; use encoding none with sine, "
            "or encoding sincos2d with model.sine=false"
        )
    user_params(name)  # answers an unknown name with the valid ones
    facts = BackboneFacts(dim=dim, heads=heads, height=grid, width=grid, prefix_tokens=0)
    args = facts.for_encoding(ENCODINGS[name], dict(params))
    shared = None if ENCODINGS[name].per_layer else build_encoding(name, **args)
    out: list[PositionEncoding] = []
    for _ in range(layers):
        enc = shared if shared is not None else build_encoding(name, **args)
        out.append(enc if sine is None else SineQK(sine, enc))
    return out


class DETRLite(nn.Module):
    """Backbone, 1x1 projection, encoder with a registry encoding, decoder, class and box heads.

    ``forward(images)`` takes ``(B, 3, H, W)`` normalised images of any size and returns
    ``pred_logits`` (B, Q, C+1), ``pred_boxes`` (B, Q, 4) in [0, 1] as ``(cx, cy, w, h)``, and
    ``aux_outputs``: the same two for every decoder layer but the last, first layer first.
    """

    def __init__(
        self,
        num_classes: int,
        backbone: BackboneName = "resnet18",
        backbone_weights: str | None = None,
        backbone_stride: Stride = 8,
        backbone_norm: Norm = "auto",
        dim: int = 64,
        heads: int = 4,
        enc_layers: int = 2,
        dec_layers: int = 2,
        mlp_ratio: float = 4.0,
        num_queries: int = 20,
        dropout: float = 0.0,
        sine: bool = True,
        encoding: str = "none",
        encoding_params: dict[str, Any] | None = None,
        image_size: int = 64,
    ) -> None:
        super().__init__()
        check_detr_args(num_classes, dim, heads, enc_layers, dec_layers, num_queries, image_size)
        self.num_classes, self.num_queries = num_classes, num_queries
        self.backbone = Backbone(backbone, backbone_stride, backbone_weights, backbone_norm)
        self.input_proj = nn.Conv2d(self.backbone.channels, dim, kernel_size=1)
        # no parameters; used for the encoder's q/k and the decoder's cross-attention keys
        self.sine = SinCos2D(dim=dim, where="qk") if sine else None
        grid = math.ceil(image_size / backbone_stride)
        encodings = encoder_encodings(
            encoding, encoding_params or {}, enc_layers, dim, heads, grid, self.sine
        )
        self.encodings = encodings  # plain list: each one is registered inside its block
        hidden = max(1, round(dim * mlp_ratio))
        self.encoder = nn.ModuleList(
            TransformerBlock(dim, heads, enc, mlp_ratio=mlp_ratio, dropout=dropout)
            for enc in encodings
        )
        self.encoder_norm = nn.LayerNorm(dim)
        self.query_pos = nn.Embedding(num_queries, dim)  # DETR's learned object queries
        self.decoder = nn.ModuleList(
            DecoderLayer(dim, heads, hidden, dropout) for _ in range(dec_layers)
        )
        self.decoder_norm = nn.LayerNorm(dim)
        self.class_head = nn.Linear(dim, num_classes + 1)  # last class = "no object"
        self.box_head = BoxHead(dim)

    def features(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """Backbone tokens (B, h*w, D) in row-major grid order and their positions (h*w, 2)."""
        feats = self.input_proj(self.backbone(images))  # (B, D, h, w)
        h, w = feats.shape[-2:]
        tokens = feats.flatten(2).transpose(1, 2)  # (B, h*w, D)
        return tokens, grid_positions(h, w, device=tokens.device)

    def encode(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """Encoder memory (B, N, D): position reaches the tokens only through the encodings."""
        x = tokens
        if self.encodings:
            x = self.encodings[0].embed(x, positions)  # absolute encodings, once at the input
        for block in self.encoder:
            x, _ = block(x, positions=positions)
        return self.encoder_norm(x)

    def decode(self, memory: Tensor, positions: Tensor) -> dict[str, Any]:
        """Predictions of every decoder layer from the memory (B, N, D) at ``positions``."""
        memory_pos = None
        if self.sine is not None:
            memory_pos = self.sine.table(positions).to(memory.dtype)  # (N, D)
        tgt = memory.new_zeros(memory.shape[0], self.num_queries, memory.shape[-1])  # (B, Q, D)
        # repeated, as DETR does, not a view: a view of a parameter made under no_grad still
        # claims requires_grad, which trips autograd hooks (FlopCounterMode's module tracker)
        query_pos = self.query_pos.weight.to(memory.dtype)[None].repeat(len(memory), 1, 1)
        states = []
        for layer in self.decoder:
            tgt = layer(tgt, memory, query_pos, memory_pos)
            states.append(self.decoder_norm(tgt))
        hs = torch.stack(states)  # (L, B, Q, D)
        logits = self.class_head(hs)  # (L, B, Q, C+1)
        boxes = self.box_head(hs)  # (L, B, Q, 4)
        aux = [{"pred_logits": logits[i], "pred_boxes": boxes[i]} for i in range(len(hs) - 1)]
        return {"pred_logits": logits[-1], "pred_boxes": boxes[-1], "aux_outputs": aux}

    def forward(self, images: Tensor) -> dict[str, Any]:
        tokens, positions = self.features(images)
        return self.decode(self.encode(tokens, positions), positions)

    def encoding_parameters(self) -> int:
        """Parameters of the encoder's position encodings (shared ones counted once)."""
        unique = {id(p): p for enc in self.encodings for p in enc.parameters()}
        return sum(p.numel() for p in unique.values())


def check_detr_args(
    num_classes: int,
    dim: int,
    heads: int,
    enc_layers: int,
    dec_layers: int,
    num_queries: int,
    image_size: int,
) -> None:
    """Raise a one-line UsageError for a model that cannot be built."""
    if heads < 1 or dim < 1 or dim % heads:
        raise UsageError(
            f"model.dim ({dim}) must be a positive multiple of model.heads ({heads}); "
            "change one of them"
        )
    if num_classes < 1:
        raise UsageError(f"the dataset must have >= 1 object class, got {num_classes}")
    if enc_layers < 0 or dec_layers < 1:
        raise UsageError(
            f"model.enc_layers must be >= 0 and model.dec_layers >= 1, "
            f"got {enc_layers} and {dec_layers}"
        )
    if num_queries < 1:
        raise UsageError(f"model.num_queries must be >= 1, got {num_queries}")
    if image_size < 1:
        raise UsageError(f"model.image_size must be >= 1, got {image_size}")


def build_detr(num_classes: int, **options: Any) -> DETRLite:
    """``DETRLite`` from recipe-style options (``model.*`` keys, values as YAML gives them):
    every name is checked against the constructor, every value converted by its type."""
    spec = signature_params(DETRLite.__init__)
    spec.pop("num_classes")
    kwargs = {}
    for key, value in options.items():
        if key not in spec:
            raise UsageError(
                f"model has no parameter {key!r}{close_match(key, spec)}; valid: {', '.join(spec)}"
            )
        if key == "encoding_params":  # checked by the encoding's own signature when built
            if value is not None and not isinstance(value, dict):
                raise UsageError(f"model.encoding_params must be a mapping, got {value!r}")
            kwargs[key] = value
        else:
            kwargs[key] = convert(value, spec[key][0], f"model.{key}")
    return DETRLite(num_classes, **kwargs)


__all__ = ["SETTINGS", "DETRLite", "DecoderLayer", "SineQK", "build_detr"]

"""DeiT image classifiers on timm's ``VisionTransformer``, with any posenc position encoding.

Touvron et al. 2021, "Training data-efficient image transformers & distillation through
attention" (DeiT): a ViT with a class token, pre-norm blocks, a final LayerNorm and a linear head
on the class token. Patch embedding, blocks (norms, MLP, drop path), head and weight init are
timm's (``timm.models.vision_transformer.VisionTransformer``, as ``deit_tiny_patch16_224`` builds
it); only the attention is posenc's, through ``vit_attention.PositionBlock``.

Conventions:

- timm's own ``pos_embed`` is off (``pos_embed="none"``): position information enters only
  through the chosen encoding. The default ``learned2d`` is DeiT's learned table
  ``(1 + h*w, dim)``, so ``build_vit("deit_tiny")`` has exactly the parameters of timm's
  ``deit_tiny_patch16_224``.
- Token order: class token first, then the patches row-major. Positions are computed once per
  forward from the input's patch grid ``h x w``: 2D encodings (and window attention) get
  ``grid_positions(h, w, prefix=1)``, the class token at ``(-1, -1)``; 1D encodings get
  ``arange(1 + h*w)`` over the flattened sequence (class token at 0).
- Absolute encodings act once, through the encoding's ``embed``, after the class token is
  prepended (DeiT's order: concatenate, then add). ``absolute=True`` also adds DeiT's learned
  table next to a relative encoding, as the official iRPE DeiT models keep it (5.76 M for
  DeiT-Ti + iRPE-K counts both).
- ``per_layer`` encodings get one instance per block, the others one shared instance
  (``model.encoding``) handed to every block.
- timm's weight init runs over the whole model; every encoding then gets its own initial
  values back (DeiT's truncated normal for ``learned2d``, zeros for iRPE, PyTorch's default for
  XL's ``W_R``), so each keeps its paper's init.
- Any image size at call time (timm's ``dynamic_img_size``: the patch grid comes from the
  input); ``learned2d`` resizes its table, relative encodings index the new grid directly.
- ``dropout`` is DeiT's ``drop``: on the embedded input, the attention weights and both residual
  branches (timm's ``pos_drop_rate``, ``attn_drop_rate``, ``proj_drop_rate``); the head has none.
- ``no_weight_decay()`` names the class token and every encoding parameter, as DeiT exempts its
  ``pos_embed``.

Importing this module registers ``posenc_<arch>`` for every arch in timm's registry, so
``timm.create_model("posenc_deit_tiny", encoding="irpe", num_classes=10)`` works. Importing
timm takes seconds: import this module only where an image model is built.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import timm
import torch
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor

from posenc_cli.encodings import build_encoding, encoding_class
from posenc_cli.encodings.base import BackboneFacts, PositionEncoding, grid_positions
from posenc_cli.encodings.learned2d import Learned2D
from posenc_cli.errors import UsageError
from posenc_cli.models.clip_layout import check_layout, clip_positions
from posenc_cli.models.vit_attention import PositionBlock, run_blocks
from posenc_cli.params import close_match


@dataclass(frozen=True)
class Arch:
    """Size of a ViT: width, blocks, heads, patch side, default image side, MLP ratio."""

    dim: int
    depth: int
    heads: int
    patch_size: int
    img_size: int
    mlp_ratio: float = 4.0


ARCHS: dict[str, Arch] = {
    "deit_tiny": Arch(dim=192, depth=12, heads=3, patch_size=16, img_size=224),
    "deit_small": Arch(dim=384, depth=12, heads=6, patch_size=16, img_size=224),
    "deit_base": Arch(dim=768, depth=12, heads=12, patch_size=16, img_size=224),
    # CPU sizes: 32 px images give an 8 x 8 grid (65 tokens), a few ms per image on one core
    "vit_micro": Arch(dim=64, depth=4, heads=4, patch_size=4, img_size=32),
    "vit_nano": Arch(dim=32, depth=2, heads=2, patch_size=4, img_size=32),
}

OVERRIDES = ("dim", "depth", "heads", "patch_size", "mlp_ratio")


def model_given_params(
    name: str, arch: Arch, grid: int, frames: int = 1, words: int = 0
) -> dict[str, Any]:
    """The encoding arguments the ViT knows (width, heads, grid, class token and caption words,
    table length), limited to those the encoding's constructor takes. A 2D table covers one
    frame, a 1D table the whole clip."""
    facts = BackboneFacts(
        dim=arch.dim,
        heads=arch.heads,
        height=grid,  # learned2d, swin: the table's grid
        width=grid,
        prefix_tokens=1 + words,  # learned2d: a row each for the class token and the words
        length=1 + words + frames * grid * grid,  # learned (1D): every token
    )
    return facts.for_encoding(encoding_class(name), {})


def build_encodings(
    name: str, params: dict[str, Any], arch: Arch, grid: int, frames: int = 1, words: int = 0
) -> tuple[PositionEncoding | None, list[PositionEncoding]]:
    """The shared instance (None for ``per_layer`` encodings) and the encoding of every block."""
    given = model_given_params(name, arch, grid, frames, words)

    def make() -> PositionEncoding:
        return build_encoding(name, **{**given, **params})  # the user's values win

    if encoding_class(name).per_layer:
        return None, [make() for _ in range(arch.depth)]
    shared = make()
    return shared, [shared] * arch.depth


class VisionModel(VisionTransformer):
    """DeiT on timm's ``VisionTransformer``: ``forward(images) -> logits (B, num_classes)``."""

    def __init__(
        self,
        *,
        arch: Arch,
        encoding: str = "learned2d",
        encoding_params: dict[str, Any] | None = None,
        absolute: bool = False,
        num_classes: int = 1000,
        img_size: int = 224,
        in_chans: int = 3,
        drop_path: float = 0.0,
        dropout: float = 0.0,
        window: int | None = None,
        window_dilation: int = 1,
        window_stride: int | None = None,
        window_global: int = 0,
        pool: Literal["token", "avg"] = "token",
        frames: int = 1,
        caption_vocab: int = 0,
        caption_words: int = 0,
    ) -> None:
        cls = encoding_class(encoding)
        if pool not in ("token", "avg"):
            raise UsageError(
                f"pool must be 'token' (DeiT) or 'avg' (mean of patches), got {pool!r}"
            )
        if absolute and cls.family == "absolute":
            raise UsageError(
                f"absolute=True adds DeiT's learned table next to a relative encoding; "
                f"{encoding!r} is already absolute: drop absolute=True"
            )
        grid = img_size // arch.patch_size
        words = caption_words if caption_vocab else 0
        shared, per_block = build_encodings(
            encoding, dict(encoding_params or {}), arch, grid, frames, words
        )
        axes = per_block[0].axes
        check_layout(encoding, cls.family, axes, frames, window, words)
        table = None
        if absolute:  # over the whole clip: it tells frames apart
            table = Learned2D(
                dim=arch.dim, height=frames * grid, width=grid, prefix_tokens=1 + words
            )
        own = list({id(e): e for e in [*per_block, table] if e is not None}.values())
        initial = [{k: v.detach().clone() for k, v in e.state_dict().items()} for e in own]
        super().__init__(
            img_size=img_size,
            patch_size=arch.patch_size,
            in_chans=in_chans,
            num_classes=num_classes,
            embed_dim=arch.dim,
            depth=arch.depth,
            num_heads=arch.heads,
            mlp_ratio=arch.mlp_ratio,
            pos_embed="none",
            dynamic_img_size=True,
            pos_drop_rate=dropout,
            attn_drop_rate=dropout,
            proj_drop_rate=dropout,
            drop_path_rate=drop_path,
            block_fn=functools.partial(
                PositionBlock,
                encodings=per_block,
                window=window,
                window_dilation=window_dilation,
                window_stride=window_stride,
                window_global=window_global,
            ),  # fmt: skip
            global_pool=pool,  # "avg" averages the patch tokens, the class token left out
        )
        for module, state in zip(own, initial, strict=True):
            module.load_state_dict(state)  # undo timm's init (it re-inits every Linear)
        self.encoding = shared
        self.absolute_table = table
        self.arch = arch
        self.encoding_name = encoding
        self.patch_size = arch.patch_size
        self.frames = frames
        self.axes = 2 if window is not None else axes
        # caption words: embedded after the class token, left out of the patches' average
        self.words = words
        self.word_embed = torch.nn.Embedding(caption_vocab, arch.dim) if words else None
        if self.word_embed is not None:
            torch.nn.init.trunc_normal_(self.word_embed.weight, std=0.02)  # as the class token
        self.num_prefix_tokens += words

    @property
    def input_encoding(self) -> PositionEncoding:
        """The encoding whose ``embed`` acts on the tokens (a no-op for relative encodings)."""
        return self.encoding if self.encoding is not None else self.blocks[0].attn.encoding

    def encoding_parameters(self) -> int:
        """Number of parameters that belong to position encodings, shared ones counted once."""
        return sum(p.numel() for p in self.encoding_tensors().values())

    def encoding_tensors(self) -> dict[int, torch.nn.Parameter]:
        """Every position-encoding parameter once, keyed by ``id``."""
        return {
            id(p): p
            for m in self.modules()
            if isinstance(m, PositionEncoding)
            for p in m.parameters()
        }

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        ids = self.encoding_tensors()
        names = {n for n, p in self.named_parameters(remove_duplicate=False) if id(p) in ids}
        return {"cls_token"} | names

    def token_positions(self, height: int, width: int, device: torch.device) -> Tensor:
        """Positions of the class token, the caption words and the ``height x width`` patches
        for the attention, by the axes the encoding reads (see ``clip_positions``)."""
        return clip_positions(self.axes, self.frames, height, width, device, self.words)

    def forward_features(  # type: ignore[override]
        self, images: Tensor, captions: Tensor | None = None
    ) -> Tensor:
        """``images`` (B, C, H, W) and caption word ids (B, words) -> normalised tokens
        (B, 1 + words + h*w, D)."""
        x = self.patch_embed(images)  # (B, h, w, D): dynamic_img_size keeps the grid
        B, h, w, D = x.shape
        positions = self.token_positions(h, w, x.device)
        head = [self.cls_token.expand(B, -1, -1)]
        if self.word_embed is not None:
            head.append(self.word_embed(captions))  # (B, words, D)
        tokens = torch.cat([*head, x.reshape(B, h * w, D)], dim=1)
        tokens = self.input_encoding.embed(tokens, positions)  # (B, N, D)
        if self.absolute_table is not None:
            prefix = 1 + self.words
            tokens = self.absolute_table.embed(tokens, grid_positions(h, w, prefix, x.device))
        tokens = self.norm_pre(self.pos_drop(tokens))
        tokens = run_blocks(self.blocks, tokens, positions, self.grad_checkpointing)
        return self.norm(tokens)

    def forward(  # type: ignore[override]
        self, images: Tensor, captions: Tensor | None = None
    ) -> Tensor:
        """``images`` (B, C, H, W), H and W multiples of the patch size, and for a captioned
        model the word ids (B, words) -> logits (B, classes)."""
        if images.dim() != 4 or images.shape[1] != self.in_chans:
            raise UsageError(
                f"expected images (B, {self.in_chans}, H, W), got shape {tuple(images.shape)}"
            )
        wanted = (len(images), self.words)
        if (captions is None) != (self.word_embed is None) or (
            captions is not None and tuple(captions.shape) != wanted
        ):
            got = "none" if captions is None else f"shape {tuple(captions.shape)}"
            raise UsageError(
                f"this model reads {'captions ' + str(wanted) if self.words else 'no captions'}"
                f", got {got}; a captioned data set needs a captioned model and the reverse"
            )
        height, width = images.shape[-2:]
        if height % (self.patch_size * self.frames) or width % self.patch_size:
            clip = f" times {self.frames} frames stacked along the rows" if self.frames > 1 else ""
            raise UsageError(
                f"image size {height}x{width} is not a multiple of the patch size "
                f"{self.patch_size}{clip}; resize or crop the images"
            )
        return self.forward_head(self.forward_features(images, captions))


def resolve_arch(arch: str, overrides: dict[str, Any]) -> Arch:
    """``ARCHS[arch]`` with ``overrides`` applied and checked."""
    if arch not in ARCHS:
        raise UsageError(
            f"unknown ViT arch {arch!r}{close_match(arch, ARCHS)}; valid: {', '.join(ARCHS)}"
        )
    for key in overrides:
        if key not in OVERRIDES:
            raise UsageError(
                f"build_vit has no option {key!r}{close_match(key, OVERRIDES)}; "
                f"sizes that may be overridden: {', '.join(OVERRIDES)}"
            )
    size = replace(ARCHS[arch], **overrides)
    if min(size.dim, size.depth, size.heads, size.patch_size) < 1 or size.mlp_ratio <= 0:
        raise UsageError(f"ViT sizes must be positive, got {size}")
    if size.dim % size.heads:
        raise UsageError(f"dim {size.dim} is not divisible by heads {size.heads}; change one")
    return size


def build_vit(
    arch: str = "deit_tiny",
    encoding: str = "learned2d",
    encoding_params: dict[str, Any] | None = None,
    num_classes: int = 1000,
    img_size: int | None = None,
    in_chans: int = 3,
    drop_path: float = 0.0,
    dropout: float = 0.0,
    window: int | None = None,
    window_dilation: int = 1,
    window_stride: int | None = None,
    window_global: int = 0,
    absolute: bool = False,
    pool: Literal["token", "avg"] = "token",
    frames: int = 1,
    caption_vocab: int = 0,
    caption_words: int = 0,
    **overrides: Any,
) -> VisionModel:
    """A DeiT-style classifier of size ``arch`` (``ARCHS``) with position encoding ``encoding``.

    ``img_size`` (default: the arch's, 224 for DeiT, 32 for the CPU sizes) sets the grid that
    ``learned2d``/``swin`` tables are built for; other sizes still run at call time.
    ``overrides`` may set ``dim``, ``depth``, ``heads``, ``patch_size``, ``mlp_ratio``.
    """
    size = resolve_arch(arch, overrides)
    img_size = size.img_size if img_size is None else img_size
    if img_size < size.patch_size or img_size % size.patch_size:
        raise UsageError(
            f"img_size {img_size} is not a positive multiple of the patch size {size.patch_size}"
        )
    if num_classes < 0 or in_chans < 1:
        raise UsageError(f"need num_classes >= 0 and in_chans >= 1, got {num_classes}, {in_chans}")
    if not 0 <= drop_path < 1 or not 0 <= dropout < 1:
        raise UsageError(f"drop_path and dropout must be in [0, 1), got {drop_path}, {dropout}")
    return VisionModel(
        arch=size,
        encoding=encoding,
        encoding_params=encoding_params,
        absolute=absolute,
        num_classes=num_classes,
        img_size=img_size,
        in_chans=in_chans,
        drop_path=drop_path,
        dropout=dropout,
        window=window,
        window_dilation=window_dilation,
        window_stride=window_stride,
        window_global=window_global,
        pool=pool,
        frames=frames,
        caption_vocab=caption_vocab,
        caption_words=caption_words,
    )


# --- timm registry ------------------------------------------------------------------------------

# arguments timm.create_model passes to every entrypoint; no posenc model has pretrained weights
TIMM_ARGS = ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir")


def timm_entrypoint(arch: str) -> Callable[..., VisionModel]:
    """``posenc_<arch>(pretrained=False, **kwargs)`` for ``timm.create_model``: kwargs are
    ``build_vit``'s; timm's ``drop_path_rate`` is accepted for ``drop_path``."""

    def create(pretrained: bool = False, **kwargs: Any) -> VisionModel:
        if pretrained:
            raise UsageError(
                f"posenc_{arch} has no pretrained weights (none can be downloaded); "
                "pass pretrained=False and train it, or load a posenc checkpoint"
            )
        for key in TIMM_ARGS:
            kwargs.pop(key, None)
        if "drop_path_rate" in kwargs:
            kwargs["drop_path"] = kwargs.pop("drop_path_rate")
        return build_vit(arch, **kwargs)

    create.__name__ = create.__qualname__ = f"posenc_{arch}"
    create.__module__ = __name__
    create.__doc__ = f"posenc {arch} ({ARCHS[arch]}); default encoding learned2d."
    return create


def register_archs() -> None:
    """Register ``posenc_<arch>`` for every arch; names already registered are left alone, so a
    second import (or ``importlib.reload``) neither fails nor warns."""
    for arch in ARCHS:
        if not timm.models.is_model(f"posenc_{arch}"):
            timm.models.register_model(timm_entrypoint(arch))


register_archs()

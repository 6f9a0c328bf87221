"""What ``posenc profile`` measures: one attention layer, or the model a recipe builds.

A ``Workload`` builds a ``Subject`` per encoding; a subject makes the input for a problem size
and runs a forward pass. Sizes are sequence lengths for text (tokens = length) and for the
attention layer; for a 2D encoding on the attention layer a length N becomes the most nearly
square grid with N patches (512 -> 16 x 32), so 1D and 2D encodings see the same token count.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from posenc_cli.encodings import ENCODINGS, build_encoding, encoding_class
from posenc_cli.encodings.base import PositionEncoding, grid_positions, grid_shape
from posenc_cli.errors import UsageError
from posenc_cli.models.attention import Attention
from posenc_cli.models.window import slot_table


class Subject(Protocol):
    module: nn.Module

    def inputs(self, size: int, batch: int, device: torch.device) -> tuple: ...

    def forward(self, inputs: tuple) -> Tensor: ...

    def tokens(self, size: int) -> int: ...


def encoding_parameters(module: nn.Module) -> int:
    """Parameters that belong to position encodings (each counted once)."""
    seen: set[int] = set()
    total = 0
    for sub in module.modules():
        if isinstance(sub, PositionEncoding):
            for p in sub.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    total += p.numel()
    return total


def near_square(n: int) -> tuple[int, int]:
    """The factor pair ``(h, w)`` of ``n`` with ``h <= w`` closest to a square."""
    h = math.isqrt(n)
    while n % h:
        h -= 1
    return h, n // h


class AttentionLayer(nn.Module):
    """The input embedding of absolute encodings, then one attention layer."""

    def __init__(
        self,
        dim: int,
        heads: int,
        encoding: str,
        params: dict[str, Any],
        window: int | None,
        dilation: int = 1,
        form: str = "softmax",
        stride: int | None = None,
        global_tokens: int = 0,
        sequence: bool = False,
    ) -> None:
        super().__init__()
        self.grid = ENCODINGS[encoding].dims == 2 or (window is not None and not sequence)
        causal = ENCODINGS[encoding].causal_only  # the only form such an encoding has
        self.encoding = build_encoding(
            encoding, dim=dim, heads=heads, head_dim=dim // heads, causal=causal, **params
        )
        self.attention = Attention(
            dim, heads, self.encoding, causal=causal, window=window, dilation=dilation, form=form,
            stride=stride, global_tokens=global_tokens,
        )  # fmt: skip
        self.dim = dim

    def positions(self, size: int, device: torch.device) -> Tensor:
        if self.grid:
            return grid_positions(*near_square(size), device=device)
        return torch.arange(size, device=device)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        x = self.encoding.embed(x, positions)
        return self.attention(x, positions=positions)


@dataclass
class LayerSubject:
    module: AttentionLayer

    def inputs(self, size: int, batch: int, device: torch.device) -> tuple:
        x = torch.randn(batch, size, self.module.dim, device=device)
        positions = self.module.positions(size, device)
        att = self.module.attention
        if att.window is not None and self.module.grid:
            # built once per grid and cached: build it before the counts, or the first
            # encoding measured would carry it alone
            height, width, _ = grid_shape(positions)
            pattern = (att.window, att.dilation, att.stride, att.global_tokens)
            slot_table(height, width, *pattern, positions.device)
        return x, positions

    def forward(self, inputs: tuple) -> Tensor:
        return self.module(*inputs)

    def tokens(self, size: int) -> int:
        return size


@dataclass
class LayerWorkload:
    """``--layer attention``: one attention layer of ``dim`` and ``heads``."""

    dim: int = 256
    heads: int = 4
    window: int | None = None
    dilation: int = 1  # the window's slots this many patches apart
    form: str = "softmax"  # or "linear": kernelised attention (models/linear_form.py)
    stride: int | None = None  # beside the window, its k x k lattice of slots this far apart
    global_tokens: int = 0  # the first patches, global beside the window
    sequence: bool = False  # the window's pattern on a 1D sequence instead of a patch grid
    fit_tables: bool = True  # build learned tables for the size measured
    params: dict[str, dict[str, Any]] = field(default_factory=dict)  # per encoding

    def __post_init__(self) -> None:
        if self.dim < 1 or self.heads < 1 or self.dim % self.heads:
            raise UsageError(
                f"--dim {self.dim} must be a positive multiple of --heads {self.heads}"
            )

    @property
    def label(self) -> str:
        window = f", window {self.window}" if self.window else ""
        if self.dilation > 1:
            window += f" dilated {self.dilation}"
        if self.stride is not None:
            window += f" strided {self.stride}"
        if self.global_tokens:
            window += f" + {self.global_tokens} global"
        if self.sequence:
            window += " on a sequence"
        if self.form != "softmax":
            window += f", {self.form} attention"
        return f"attention layer (dim {self.dim}, heads {self.heads}{window})"

    def check(self, encoding: str) -> None:
        cls = encoding_class(encoding)
        if self.window is not None and self.sequence and cls.dims != 1:
            raise UsageError(
                f"--window --sequence needs a sequence encoding; {encoding!r} is not one "
                "(drop --sequence or compare 1D encodings)"
            )
        if self.window is not None and not self.sequence and cls.dims != 2 and encoding != "none":
            raise UsageError(
                f"--window needs an image encoding or none; {encoding!r} is a sequence "
                "encoding (add --sequence for a window on the sequence, or compare 2D encodings)"
            )

    def subject(self, encoding: str, size: int | None = None) -> LayerSubject:
        self.check(encoding)
        params = {**self.table_size(encoding, size), **self.params.get(encoding, {})}
        layer = AttentionLayer(
            self.dim, self.heads, encoding, params, self.window, self.dilation, self.form,
            self.stride, self.global_tokens, self.sequence,
        )  # fmt: skip
        return LayerSubject(layer)

    def table_size(self, encoding: str, size: int | None) -> dict[str, Any]:
        """Learned tables (absolute, Swin) built for the input measured, no class token: the
        profile measures cost; whether an encoding runs past its trained length is another
        question (the ``extrapolates`` column)."""
        if not self.fit_tables or not size:
            return {}
        height, width = near_square(size)
        return {
            "learned": {"length": size},
            "learned2d": {"height": height, "width": width, "prefix_tokens": 0},
            "swin": {"height": height, "width": width},
        }.get(encoding, {})


@dataclass
class TextSubject:
    module: nn.Module
    vocab: int

    def inputs(self, size: int, batch: int, device: torch.device) -> tuple:
        gen = torch.Generator().manual_seed(size)
        return (torch.randint(0, self.vocab, (batch, size), generator=gen).to(device),)

    def forward(self, inputs: tuple) -> Tensor:
        return self.module(*inputs).logits

    def tokens(self, size: int) -> int:
        return size


@dataclass
class RecipeWorkload:
    """The model of a text recipe (or of a run's saved recipe), with its encoding swapped."""

    recipe: Any  # posenc_cli.config.Recipe
    overrides: list[str]

    @property
    def label(self) -> str:
        m = self.recipe.model
        return (
            f"{self.recipe.source}: {self.recipe.data.task} model "
            f"(dim {m.dim}, depth {m.depth}, heads {m.heads})"
        )

    @property
    def encoding(self) -> str:
        return self.recipe.encoding.name

    def check(self, encoding: str) -> None:
        if encoding_class(encoding).dims != 1:
            raise UsageError(
                f"{encoding!r} is an image encoding; a text recipe takes sequence encodings"
            )

    def subject(self, encoding: str, size: int | None = None) -> TextSubject:
        from posenc_cli.config import load_recipe
        from posenc_cli.data import build_task
        from posenc_cli.models.text import build_text_model

        self.check(encoding)
        recipe = self.recipe
        if encoding != recipe.encoding.name:
            recipe = load_recipe(recipe.source, [*self.overrides, f"encoding.name={encoding}"])
        task = build_task(recipe.data)
        model = build_text_model(recipe.model, recipe.encoding, task, recipe.data)
        return TextSubject(model, task.vocab_size)


def random_images(batch: int, channels: int, side: int, device: torch.device) -> Tensor:
    """Square images of ``side`` px, the same for every encoding measured at that side."""
    gen = torch.Generator().manual_seed(side)
    return torch.randn(batch, channels, side, side, generator=gen).to(device)  # (B, C, S, S)


# What a model needs from the data without reading it: classes and channels per data set.
IMAGE_SHAPES = {
    "digits": (10, 1),
    "direction": (4, 3),
    "cifar10": (10, 3),
    "cifar100": (100, 3),
    "folder": (1000, 3),  # an ImageNet-layout folder
}


@dataclass
class ImageSubject:
    module: nn.Module
    channels: int
    patch: int

    def inputs(self, size: int, batch: int, device: torch.device) -> tuple:
        return (random_images(batch, self.channels, size, device),)

    def forward(self, inputs: tuple) -> Tensor:
        return self.module(*inputs)

    def tokens(self, size: int) -> int:
        return 1 + (size // self.patch) ** 2  # class token + patches


@dataclass
class ImageRecipeWorkload:
    """The ViT of an image recipe, fed square images of each side; sizes are sides in px."""

    recipe: Any
    overrides: list[str]

    @property
    def label(self) -> str:
        m = self.recipe.model
        return f"{self.recipe.source}: {m.arch} on {self.recipe.data.dataset}"

    def check(self, encoding: str) -> None:
        encoding_class(encoding)

    def subject(self, encoding: str, size: int | None = None) -> ImageSubject:
        from posenc_cli.config import load_recipe
        from posenc_cli.tasks.image.train import build_image_model

        recipe = self.recipe
        if encoding != recipe.encoding.name:
            recipe = load_recipe(recipe.source, [*self.overrides, f"encoding.name={encoding}"])
        if encoding == "none":  # the baseline has no position information at all
            recipe = dataclasses.replace(
                recipe, model=dataclasses.replace(recipe.model, absolute=False)
            )
        classes, channels = IMAGE_SHAPES.get(recipe.data.dataset, (1000, 3))
        model = build_image_model(recipe, classes, channels, recipe.data.image_size)
        return ImageSubject(model, channels, model.arch.patch_size)


@dataclass
class DetectionSubject:
    module: nn.Module
    stride: int

    def inputs(self, size: int, batch: int, device: torch.device) -> tuple:
        return (random_images(batch, 3, size, device),)

    def forward(self, inputs: tuple) -> Tensor:
        out = self.module(*inputs)
        return out["pred_logits"].sum() + out["pred_boxes"].sum()  # every head reaches backward

    def tokens(self, size: int) -> int:
        return math.ceil(size / self.stride) ** 2  # encoder tokens: the feature map


@dataclass
class DetectionRecipeWorkload:
    """DETR-lite of a detection recipe, fed square images of each side (px)."""

    recipe: Any
    overrides: list[str]

    @property
    def label(self) -> str:
        m = self.recipe.model
        return f"{self.recipe.source}: DETR-lite ({m.backbone}, stride {m.backbone_stride})"

    def check(self, encoding: str) -> None:
        if encoding != "none" and encoding_class(encoding).dims != 2:
            raise UsageError(f"{encoding!r} is a sequence encoding; DETR-lite takes 2D ones")

    def subject(self, encoding: str, size: int | None = None) -> DetectionSubject:
        from posenc_cli.config import load_recipe
        from posenc_cli.tasks.detection.train import build_detection_model

        recipe = self.recipe
        if encoding != recipe.encoding.name:
            recipe = load_recipe(recipe.source, [*self.overrides, f"encoding.name={encoding}"])
        model = build_detection_model(recipe, num_classes=3)  # classes change only the head
        return DetectionSubject(model, recipe.model.backbone_stride)


# Each task's workload for `posenc profile RECIPE`, with the encodings that fit it.


def text_workload(recipe, overrides: list[str]) -> tuple[RecipeWorkload, list[str]]:
    compatible = [n for n, c in ENCODINGS.items() if c.dims == 1]
    return RecipeWorkload(recipe, overrides), compatible


def image_workload(recipe, overrides: list[str]) -> tuple[ImageRecipeWorkload, list[str]]:
    return ImageRecipeWorkload(recipe, overrides), list(ENCODINGS)


def detection_workload(recipe, overrides: list[str]) -> tuple[DetectionRecipeWorkload, list[str]]:
    compatible = [n for n, c in ENCODINGS.items() if c.dims == 2 or n == "none"]
    if recipe.model.sine:  # the sine is already on q/k
        compatible.remove("sincos2d")
    return DetectionRecipeWorkload(recipe, overrides), compatible

"""The sections of a detection recipe (``kind: detection``): DETR-lite on a COCO-format set.

Read by the recipe loader (``config/``) like the other kinds: values converted by declared
type, keys checked by name; ``validate`` holds the rules across fields. The encoder's position
setting is two keys, ``model.sine`` (DETR's sinusoid on queries and keys) and ``encoding.name``
(a 2D registry encoding in the encoder self-attention): see ``detection/detr.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from posenc_cli.errors import UsageError
from posenc_cli.params import bounded


@dataclass
class DetectionModelConfig:
    backbone: Literal["resnet18", "resnet34", "resnet50"] = "resnet18"
    backbone_weights: str | None = None  # a local state_dict file; None = random init
    # 8, 16 or 32: which ResNet stage the features come from
    backbone_stride: int = bounded(8, lambda v: v in (8, 16, 32), "8, 16 or 32")
    # BatchNorm: frozen (DETR's, for loaded weights), batch (trained), auto (frozen iff weights)
    backbone_norm: Literal["auto", "frozen", "batch"] = "auto"
    dim: int = bounded(64, lambda v: v >= 1, ">= 1", most=65_536)
    heads: int = bounded(4, lambda v: v >= 1, ">= 1", most=1_024)
    enc_layers: int = bounded(2, lambda v: v >= 0, ">= 0", most=1_024)
    dec_layers: int = bounded(2, lambda v: v >= 1, ">= 1", most=1_024)
    mlp_ratio: float = bounded(4.0, lambda v: v > 0, "> 0")
    num_queries: int = bounded(20, lambda v: v >= 1, ">= 1", most=100_000)
    dropout: float = bounded(0.0, lambda v: 0 <= v < 1, "in [0, 1)")
    sine: bool = True  # DETR's 2D sinusoid on encoder q/k and cross-attention keys


@dataclass
class DetectionDataConfig:
    root: str = "runs/data/shapes"  # COCO layout: shapes (train/, val/) or 2017 (train2017/ ...)
    layout: Literal["auto", "shapes", "coco"] = "auto"
    # images are resized to a square of this side
    image_size: int = bounded(64, lambda v: v >= 32, ">= 32", most=16_384)
    # > 0: write a procedural shapes set of this many images at root
    shapes_images: int = bounded(
        0, lambda v: v >= 0, ">= 0 (0 = read data.root as it is)", most=10_000_000
    )
    shapes_seed: int = 0
    shapes_max_objects: int = bounded(4, lambda v: v >= 1, ">= 1", most=1_000)


@dataclass
class DetectionTrainConfig:
    epochs: int = bounded(10, lambda v: v >= 1, ">= 1", most=1_000_000)
    batch_size: int = bounded(8, lambda v: v >= 1, ">= 1", most=1_000_000)
    lr: float = bounded(1e-4, lambda v: v > 0, "> 0")
    # DETR trains its backbone ten times slower
    lr_backbone: float = bounded(1e-5, lambda v: v >= 0, ">= 0 (0 = frozen backbone)")
    weight_decay: float = bounded(1e-4, lambda v: v >= 0, ">= 0")
    # epoch at which the learning rate drops tenfold (DETR: 200 of 300); 0 = never
    lr_drop: int = bounded(0, lambda v: v >= 0, ">= 0 (0 = never)", most=1_000_000)
    grad_clip: float = bounded(0.1, lambda v: v >= 0, ">= 0 (0 = no clipping)")
    # weight of the no-object class
    eos_coef: float = bounded(0.1, lambda v: 0 < v <= 1, "in (0, 1]")
    workers: int = bounded(0, lambda v: v >= 0, ">= 0", most=256)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    tensorboard: bool = True  # event files beside metrics.jsonl (rank 0)


@dataclass
class DetectionEvalConfig:
    batch_size: int = bounded(16, lambda v: v >= 1, ">= 1", most=1_000_000)
    # validation images drawn with predicted and true boxes
    pictures: int = bounded(4, lambda v: v >= 0, ">= 0", most=10_000)
    # for the pictures only; COCO AP uses every detection
    score_threshold: float = bounded(0.5, lambda v: 0 <= v <= 1, "in [0, 1]")


DEFAULT_ENCODING = "none"
ENCODING_DIMS = (2,)  # DETR-lite's encoder runs on the feature grid
ENCODINGS_ALSO = ("none",)  # no encoding at all (DETR's sine aside)
SECTIONS: dict[str, type] = {
    "model": DetectionModelConfig,
    "data": DetectionDataConfig,
    "train": DetectionTrainConfig,
    "eval": DetectionEvalConfig,
}

Error = Callable[[str, str], UsageError]


def validate(recipe: Any, error: Error) -> None:
    model = recipe.model
    if model.dim % model.heads:
        raise error("model.heads", f"{model.heads} does not divide model.dim {model.dim}")


def model_options(recipe: Any) -> dict[str, Any]:
    """The ``build_detr`` keywords of a detection recipe."""
    from dataclasses import asdict

    return {
        **asdict(recipe.model),
        "encoding": recipe.encoding.name,
        "encoding_params": dict(recipe.encoding.params),
        "image_size": recipe.data.image_size,
    }


def build_encoding_once(recipe: Any) -> None:
    """Build the model's encoder encodings alone, to check the encoding and its parameters."""
    from posenc_cli.encodings.sincos2d import SinCos2D
    from posenc_cli.tasks.detection.detr import encoder_encodings

    m = recipe.model
    grid = -(-recipe.data.image_size // m.backbone_stride)
    sine = SinCos2D(dim=m.dim, where="qk") if m.sine else None
    encoder_encodings(
        recipe.encoding.name, dict(recipe.encoding.params), 1, m.dim, m.heads, grid, sine
    )

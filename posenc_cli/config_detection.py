"""The sections of a detection recipe (``kind: detection``): DETR-lite on a COCO-format set.

Read by the recipe loader (``config.py``) like the other kinds: values converted by declared
type, keys checked by name; ``validate`` holds the rules across fields. The encoder's position
setting is two keys, ``model.sine`` (DETR's sinusoid on queries and keys) and ``encoding.name``
(a 2D registry encoding in the encoder self-attention): see ``detection/detr.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from posenc_cli.errors import UsageError
from posenc_cli.params import Limit, check_limits


@dataclass
class DetectionModelConfig:
    backbone: Literal["resnet18", "resnet34", "resnet50"] = "resnet18"
    backbone_weights: str | None = None  # a local state_dict file; None = random init
    backbone_stride: int = 8  # 8, 16 or 32: which ResNet stage the features come from
    # BatchNorm: frozen (DETR's, for loaded weights), batch (trained), auto (frozen iff weights)
    backbone_norm: Literal["auto", "frozen", "batch"] = "auto"
    dim: int = 64
    heads: int = 4
    enc_layers: int = 2
    dec_layers: int = 2
    mlp_ratio: float = 4.0
    num_queries: int = 20
    dropout: float = 0.0
    sine: bool = True  # DETR's 2D sinusoid on encoder q/k and cross-attention keys


@dataclass
class DetectionDataConfig:
    root: str = "runs/data/shapes"  # COCO layout: shapes (train/, val/) or 2017 (train2017/ ...)
    layout: Literal["auto", "shapes", "coco"] = "auto"
    image_size: int = 64  # images are resized to a square of this side
    shapes_images: int = 0  # > 0: write a procedural shapes set of this many images at root
    shapes_seed: int = 0
    shapes_max_objects: int = 4


@dataclass
class DetectionTrainConfig:
    epochs: int = 10
    batch_size: int = 8
    lr: float = 1e-4
    lr_backbone: float = 1e-5  # DETR trains its backbone ten times slower
    weight_decay: float = 1e-4
    lr_drop: int = 0  # epoch at which the learning rate drops tenfold (DETR: 200 of 300); 0 = never
    grad_clip: float = 0.1
    eos_coef: float = 0.1  # weight of the no-object class
    workers: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    tensorboard: bool = True  # event files beside metrics.jsonl (rank 0)


@dataclass
class DetectionEvalConfig:
    batch_size: int = 16
    pictures: int = 4  # validation images drawn with predicted and true boxes
    score_threshold: float = 0.5  # for the pictures only; COCO AP uses every detection


DEFAULT_ENCODING = "none"
ENCODING_DIMS = (1, 2)  # sequence encodings read the flattened grid
SECTIONS: dict[str, type] = {
    "model": DetectionModelConfig,
    "data": DetectionDataConfig,
    "train": DetectionTrainConfig,
    "eval": DetectionEvalConfig,
}

Error = Callable[[str, str], UsageError]

LIMITS: list[Limit] = [
    ("seed", lambda v: v >= 0, ">= 0"),
    ("model.backbone_stride", lambda v: v in (8, 16, 32), "8, 16 or 32"),
    ("model.dim", lambda v: v >= 1, ">= 1"),
    ("model.heads", lambda v: v >= 1, ">= 1"),
    ("model.enc_layers", lambda v: v >= 0, ">= 0"),
    ("model.dec_layers", lambda v: v >= 1, ">= 1"),
    ("model.mlp_ratio", lambda v: v > 0, "> 0"),
    ("model.num_queries", lambda v: v >= 1, ">= 1"),
    ("model.dropout", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("data.image_size", lambda v: v >= 32, ">= 32"),
    ("data.shapes_images", lambda v: v >= 0, ">= 0 (0 = read data.root as it is)"),
    ("data.shapes_max_objects", lambda v: v >= 1, ">= 1"),
    ("train.epochs", lambda v: v >= 1, ">= 1"),
    ("train.batch_size", lambda v: v >= 1, ">= 1"),
    ("train.lr", lambda v: v > 0, "> 0"),
    ("train.lr_backbone", lambda v: v >= 0, ">= 0 (0 = frozen backbone)"),
    ("train.weight_decay", lambda v: v >= 0, ">= 0"),
    ("train.lr_drop", lambda v: v >= 0, ">= 0 (0 = never)"),
    ("train.grad_clip", lambda v: v >= 0, ">= 0 (0 = no clipping)"),
    ("train.eos_coef", lambda v: 0 < v <= 1, "in (0, 1]"),
    ("train.workers", lambda v: v >= 0, ">= 0"),
    ("eval.batch_size", lambda v: v >= 1, ">= 1"),
    ("eval.pictures", lambda v: v >= 0, ">= 0"),
    ("eval.score_threshold", lambda v: 0 <= v <= 1, "in [0, 1]"),
]


def validate(recipe: Any, error: Error) -> None:
    check_limits(recipe, LIMITS, error)
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
    from posenc_cli.detection.detr import encoder_encodings
    from posenc_cli.encodings.sincos2d import SinCos2D

    m = recipe.model
    grid = -(-recipe.data.image_size // m.backbone_stride)
    sine = SinCos2D(dim=m.dim, where="qk") if m.sine else None
    encoder_encodings(
        recipe.encoding.name, dict(recipe.encoding.params), 1, m.dim, m.heads, grid, sine
    )

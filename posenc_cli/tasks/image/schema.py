"""The sections of an image recipe (``kind: image``): a DeiT-style ViT on an image data set.

The recipe loader (``config/``) reads these dataclasses exactly as it reads the text ones:
every value is converted by its declared type, every key checked by name. ``validate`` holds
the rules a single field's type cannot say.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from posenc_cli.errors import UsageError
from posenc_cli.params import bounded


@dataclass
class ImageModelConfig:
    arch: str = "vit_micro"  # a name of posenc_cli.models.vit.ARCHS
    # 0 = the arch's own; the four below likewise
    dim: int = bounded(0, lambda v: v >= 0, ">= 0 (0 = the arch's)", most=65_536)
    depth: int = bounded(0, lambda v: v >= 0, ">= 0 (0 = the arch's)", most=1_024)
    heads: int = bounded(0, lambda v: v >= 0, ">= 0 (0 = the arch's)", most=1_024)
    patch_size: int = bounded(0, lambda v: v >= 0, ">= 0 (0 = the arch's)", most=4_096)
    # stochastic depth, the rate of the last block (DeiT: 0.1)
    drop_path: float = bounded(0.1, lambda v: 0 <= v < 1, "in [0, 1)")
    dropout: float = bounded(0.0, lambda v: 0 <= v < 1, "in [0, 1)")
    # local k x k window attention; 0 = full attention
    window: int = bounded(
        0, lambda v: v == 0 or (v > 0 and v % 2 == 1), "0 or an odd number", most=4_095
    )
    # a dilated window: its k x k slots this many patches apart (needs window)
    window_dilation: int = bounded(1, lambda v: v >= 1, ">= 1", most=1_024)
    # a strided window (Child et al. 2019): beside the window, its k x k lattice of slots this
    # many patches apart; 0 = none (needs window)
    window_stride: int = bounded(0, lambda v: v >= 0, ">= 0 (0 = none)", most=1_024)
    # global tokens (BigBird, Longformer): the first this many patches, row-major, see and are
    # seen by every token, as the class token is (needs window)
    window_global: int = bounded(0, lambda v: v >= 0, ">= 0", most=1_000_000)
    pool: Literal["token", "avg"] = "token"  # the class token (DeiT) or the mean of patches
    # DeiT's learned table in the model: added beside a relative encoding (as DeiT-iRPE does);
    # with learned2d it is that encoding itself
    absolute: bool = False


@dataclass
class ImageDataConfig:
    dataset: str = "digits"  # a name of posenc_cli.data.images.IMAGE_DATASETS
    root: str | None = None  # folder of CIFAR batches or of train/ and val/ class folders
    # the side the model is built and trained for
    image_size: int = bounded(32, lambda v: v >= 1, ">= 1", most=16_384)
    # procedural sizes or caps on real sets; None = default
    train_size: int | None = bounded(None, most=1_000_000_000)
    val_size: int | None = bounded(None, most=1_000_000_000)
    seed: int = 0  # the data (split, scenes, subsets): the same for every model seed
    randaugment: str | None = None  # timm string, e.g. rand-m9-mstd0.5-inc1
    random_erasing: float = bounded(0.0, lambda v: 0 <= v <= 1, "in [0, 1]")
    hflip: float | None = None  # None = the data set's default (0 where a flip moves labels)
    crop_scale: list[float] = field(default_factory=lambda: [0.08, 1.0])  # photos: random crop
    interpolation: str = "bicubic"
    # validation images moved this many pixels (evaluation sets it per shift)
    shift: int = bounded(0, lambda v: v >= 0, ">= 0", most=16_384)
    # frames per clip, stacked along the rows (motion); 1 = a plain image
    frames: int = bounded(1, lambda v: v >= 1, ">= 1", most=1_024)


@dataclass
class ImageTrainConfig:
    epochs: int = bounded(10, lambda v: v >= 1, ">= 1", most=1_000_000)
    batch_size: int = bounded(64, lambda v: v >= 1, ">= 1", most=1_000_000)
    # peak learning rate (DeiT: 5e-4 x batch / 512)
    lr: float = bounded(5e-4, lambda v: v > 0, "> 0")
    min_lr: float = bounded(1e-5, lambda v: v >= 0, ">= 0")
    weight_decay: float = bounded(0.05, lambda v: v >= 0, ">= 0")
    warmup_epochs: int = bounded(1, lambda v: v >= 0, ">= 0", most=1_000_000)
    label_smoothing: float = bounded(0.1, lambda v: 0 <= v < 1, "in [0, 1)")
    mixup: float = bounded(0.0, lambda v: v >= 0, ">= 0 (0 = off)")  # Mixup alpha; 0 = off
    cutmix: float = bounded(0.0, lambda v: v >= 0, ">= 0 (0 = off)")  # CutMix alpha; 0 = off
    ema: bool = False  # keep an exponential moving average of the weights and score it
    ema_decay: float = bounded(0.9998, lambda v: 0 < v < 1, "in (0, 1)")
    grad_clip: float = bounded(0.0, lambda v: v >= 0, ">= 0 (0 = no clipping)")  # 0 = no clipping
    workers: int = bounded(0, lambda v: v >= 0, ">= 0", most=256)  # DataLoader worker processes
    device: Literal["auto", "cpu", "cuda"] = "auto"
    tensorboard: bool = True  # event files beside metrics.jsonl (rank 0)


@dataclass
class ImageEvalConfig:
    sizes: list[int] = bounded(factory=list, most=16_384)  # image sides; empty = the trained size
    shifts: list[int] = bounded(factory=lambda: [0], most=16_384)  # translated copies of val
    batch_size: int = bounded(256, lambda v: v >= 1, ">= 1", most=1_000_000)


DEFAULT_ENCODING = "learned2d"
ENCODING_DIMS = (1, 2, 3)  # 1D ones read the flattened grid, N-D ones (t, row, col)
SECTIONS: dict[str, type] = {
    "model": ImageModelConfig,
    "data": ImageDataConfig,
    "train": ImageTrainConfig,
    "eval": ImageEvalConfig,
}

Error = Callable[[str, str], UsageError]  # (dotted key, problem) -> the one-line error


def size_overrides(model: ImageModelConfig) -> dict[str, int]:
    """The size settings a recipe changed from its arch (0 = keep the arch's)."""
    keys = ("dim", "depth", "heads", "patch_size")
    return {k: getattr(model, k) for k in keys if getattr(model, k)}


def sparse_window(model: ImageModelConfig) -> dict[str, int]:
    """``build_vit``'s strided-window and global-token arguments, where the recipe sets them."""
    given = {"window_stride": model.window_stride, "window_global": model.window_global}
    return {k: v for k, v in given.items() if v}


def model_overrides(model: ImageModelConfig) -> dict[str, int]:
    """The ``build_vit`` keywords a recipe sets beyond those the image task names one by one:
    the size settings changed from the arch, and the sparse-window options."""
    return {**size_overrides(model), **sparse_window(model)}


def validate(recipe: Any, error: Error) -> None:
    """Rules across fields; the model is sized (not built) to check the arch and the grid."""
    from posenc_cli.data.images import IMAGE_DATASETS
    from posenc_cli.models.vit import ARCHS, resolve_arch

    model, data = recipe.model, recipe.data
    if model.arch not in ARCHS:
        from posenc_cli.params import close_match

        raise error(
            "model.arch",
            f"unknown arch {model.arch!r}{close_match(model.arch, ARCHS)}; "
            f"valid: {', '.join(ARCHS)}",
        )
    try:
        size = resolve_arch(model.arch, size_overrides(model))
    except UsageError as err:
        raise error("model", str(err)) from None
    for side_key, sides in (
        ("data.image_size", [data.image_size]),
        ("eval.sizes", recipe.eval.sizes),
    ):
        for side in sides:
            if side < size.patch_size or side % size.patch_size:
                raise error(
                    side_key,
                    f"{side} px is not a multiple of the patch size {size.patch_size}; "
                    "pick a multiple or change model.patch_size",
                )
    sparse = {
        "model.window_stride": model.window_stride,
        "model.window_global": model.window_global,
    }
    for key, value in sparse.items():
        if value and not model.window:
            raise error(key, f"{value} needs a local window and model.window is 0; set it, e.g. 3")
    smallest = min([data.image_size, *recipe.eval.sizes]) // size.patch_size
    if model.window_global > smallest**2:
        raise error(
            "model.window_global",
            f"{model.window_global} global patches exceed the {smallest**2} of the "
            f"{smallest} x {smallest} grid; give at most {smallest**2}",
        )
    if any(s < 0 for s in recipe.eval.shifts) or not recipe.eval.shifts:
        raise error(
            "eval.shifts", f"expected shifts >= 0 pixels, e.g. [0, 4], got {recipe.eval.shifts!r}"
        )
    if data.dataset not in IMAGE_DATASETS:
        from posenc_cli.params import close_match

        raise error(
            "data.dataset",
            f"unknown data set {data.dataset!r}{close_match(data.dataset, IMAGE_DATASETS)}; "
            f"valid: {', '.join(IMAGE_DATASETS)}",
        )
    if data.dataset == "captions" and (recipe.train.mixup or recipe.train.cutmix):
        raise error(
            "train.mixup",
            "Mixup and CutMix blend two images, and a caption belongs to one; set train.mixup "
            "and train.cutmix to 0 for captions",
        )
    # data.root is checked when the data is read: a recipe for files elsewhere (ImageNet on a
    # GPU machine) still loads here, for --dry-run and posenc profile


def build_encoding_once(recipe: Any) -> None:
    """Build the recipe's encoding as the model would (its width, heads and grid) to check
    its parameters; raises the encoding's UsageError."""
    from posenc_cli.encodings import build_encoding
    from posenc_cli.models.vit import model_given_params, resolve_arch

    size = resolve_arch(recipe.model.arch, size_overrides(recipe.model))
    name = recipe.encoding.name
    given = model_given_params(name, size, recipe.data.image_size // size.patch_size)
    build_encoding(name, **{**given, **recipe.encoding.params})

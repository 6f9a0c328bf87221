"""The convolutional backbone of DETR-lite: a torchvision ResNet cut after one of its stages.

Carion et al. 2020 (DETR) use an ImageNet ResNet-50 with frozen BatchNorm statistics
(``FrozenBatchNorm2d``) and take the stride-32 output of ``layer4``. Here:

- ``resnet18``, ``resnet34`` or ``resnet50`` from torchvision, built with ``weights=None`` (no
  downloads, ever). With ``norm="frozen"`` every BatchNorm is ``FrozenBatchNorm2d``: its scale,
  shift, mean and variance are buffers, never trained and never updated from batch statistics.
- ``stride`` picks the stage: 8 (``layer2``), 16 (``layer3``) or 32 (``layer4``, DETR's). Small
  images need a small stride: a 64 px image gives an 8 x 8 grid at stride 8, but 2 x 2 at 32.
  The stages past the chosen one are not built, so they cost nothing.
- ``weights`` is a local file holding a ResNet ``state_dict`` (torchvision or timm key names,
  e.g. ``torch.save(resnet18(...).state_dict(), path)``), read with ``weights_only=True``. Every
  key of the stages that are kept must be in it and no other (strict); the classifier (``fc.*``)
  and the keys of the stages that were cut off are ignored, and so is BatchNorm's
  ``num_batches_tracked``.
- ``norm`` picks the normalisation: ``frozen`` (DETR's), ``batch`` (ordinary ``BatchNorm2d``,
  trained, with running statistics) or ``auto``, which is ``frozen`` with weights and ``batch``
  without. Without weights a frozen BatchNorm is the identity (scale 1, shift 0, mean 0,
  variance 1), so the network would train with no normalisation at all: on the shapes set that
  stayed at AP 0 for 20 epochs, while ``batch`` learned within 15 (see ``recipes/detection``).
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Literal

import torch
import torchvision
from torch import Tensor, nn
from torchvision.ops import FrozenBatchNorm2d

from posenc_cli.errors import UsageError

BackboneName = Literal["resnet18", "resnet34", "resnet50"]
Stride = Literal[8, 16, 32]
Norm = Literal["auto", "frozen", "batch"]

BACKBONES = ("resnet18", "resnet34", "resnet50")
NORMS = ("auto", "frozen", "batch")
STAGES: dict[int, int] = {8: 2, 16: 3, 32: 4}  # stride -> last ResNet stage kept (layerN)


def stage_channels(name: str, stage: int) -> int:
    """Output channels of ``layer{stage}``: 64 * 2^(stage-1), times 4 for the bottleneck net."""
    expansion = 4 if name == "resnet50" else 1
    return 64 * 2 ** (stage - 1) * expansion


def read_weights(path: str) -> dict[str, Tensor]:
    """The state_dict in ``path``; a UsageError naming ``model.backbone_weights`` if it is not
    there or is not a state_dict."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise UsageError(
            f"model.backbone_weights: no file {str(file)!r}; give the path of a saved ResNet "
            f"state_dict, or leave it unset to train from scratch"
        )
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # pickle, zip and tensor errors all mean "not a state_dict"
        raise UsageError(
            f"model.backbone_weights: cannot read {str(file)!r} as a state_dict "
            f"({type(err).__name__}); save it with torch.save(model.state_dict(), path)"
        ) from err
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise UsageError(
            f"model.backbone_weights: {str(file)!r} is not a flat state_dict of tensors; "
            f"save it with torch.save(model.state_dict(), path)"
        )
    return state


class Backbone(nn.Module):
    """ResNet stages up to ``layer{N}``: ``(B, 3, H, W) -> (B, channels, ceil(H / stride),
    ceil(W / stride))``."""

    def __init__(
        self,
        name: BackboneName = "resnet18",
        stride: Stride = 8,
        weights: str | None = None,
        norm: Norm = "auto",
    ) -> None:
        super().__init__()
        if name not in BACKBONES:
            raise UsageError(f"model.backbone: unknown {name!r}; valid: {', '.join(BACKBONES)}")
        if stride not in STAGES:
            raise UsageError(
                f"model.backbone_stride: {stride!r} is not one of 8, 16, 32 "
                f"(the outputs of layer2, layer3, layer4)"
            )
        if norm not in NORMS:
            raise UsageError(f"model.backbone_norm: unknown {norm!r}; valid: {', '.join(NORMS)}")
        if norm == "auto":
            norm = "frozen" if weights is not None else "batch"
        layer = FrozenBatchNorm2d if norm == "frozen" else nn.BatchNorm2d
        net = getattr(torchvision.models, name)(weights=None, norm_layer=layer)
        last = STAGES[stride]
        kept = ["conv1", "bn1", "relu", "maxpool"] + [f"layer{i}" for i in range(1, last + 1)]
        # named children, so checkpoint keys map unchanged ("layer2.0.conv1.weight")
        self.body = nn.Sequential(OrderedDict((k, getattr(net, k)) for k in kept))
        self.name, self.stride, self.norm = name, stride, norm
        self.channels = stage_channels(name, last)
        if weights is not None:
            self.load_weights(weights)

    def load_weights(self, path: str) -> None:
        """Load the kept stages from a ResNet state_dict file, strictly (see the module doc)."""
        state = read_weights(path)
        # BatchNorm's step counter is neither needed nor present in every file
        mine = {k for k in self.body.state_dict() if not k.endswith("num_batches_tracked")}
        # keys of stages we cut off (and the classifier) are expected in a full ResNet file
        kept = {
            k: v
            for k, v in state.items()
            if k.split(".")[0] in self.body._modules and not k.endswith("num_batches_tracked")
        }
        missing = sorted(mine - set(kept))
        unexpected = sorted(set(kept) - mine)
        if unexpected:
            raise UsageError(
                f"model.backbone_weights: {path!r} has {len(unexpected)} key(s) that "
                f"{self.name} lacks, first {unexpected[0]!r}; is it a {self.name} state_dict?"
            )
        if missing:
            raise UsageError(
                f"model.backbone_weights: {path!r} lacks {len(missing)} {self.name} key(s), "
                f"first {missing[0]!r}; is it a {self.name} state_dict?"
            )
        try:
            self.body.load_state_dict(kept, strict=False)  # missing keys were checked above
        except RuntimeError as err:  # shape mismatch: another depth or width of ResNet
            first = str(err).splitlines()[1].strip() if "\n" in str(err) else str(err)
            raise UsageError(
                f"model.backbone_weights: {path!r} does not fit {self.name}: {first}"
            ) from err

    def forward(self, images: Tensor) -> Tensor:
        return self.body(images)  # (B, channels, H / stride, W / stride)

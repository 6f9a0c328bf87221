"""Where the ViT puts its tokens: the positions of an image, or of a clip of frames.

A clip of ``frames`` frames reaches the ViT as one image with the frames stacked along the rows
(``(C, frames * side, side)``), so patch embedding, augmentation and resizing need nothing new;
only the positions change. The class token comes first, then the patches row-major, and the
encoding is given the axes it reads (its ``axes``):

- 1 axis: the index of the token in the flattened clip, ``0 .. N-1`` (1D encodings);
- 2 axes: ``(row, col)`` inside the token's own frame (2D encodings, and N-D ones built for two
  axes), so an image encoding sees each frame as an image and frames are not told apart, as
  when an image encoding is applied frame by frame; the class token at ``(-1, -1)``;
- 3 axes: ``(t, row, col)`` (N-D encodings: ``irpe_nd``, ``mrope``), ``t = 0`` for a plain
  image, the class token at -1 on every axis.

Caption words (``words`` of them, after the class token) are counted in front of the image:
1D encodings number them before the patches; 2D encodings see them as prefix tokens at
``(-1, -1)``, as an image encoding has no place for text; N-D encodings put word ``i`` at ``i``
on every axis and start the image at ``words``, M-RoPE's rule for text before an image.

Window attention works on one image's grid, so it takes 2 axes, no clip and no caption.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc_cli.encodings.base import PREFIX, grid_positions
from posenc_cli.errors import UsageError


def clip_positions(
    axes: int, frames: int, height: int, width: int, device: torch.device | None = None,
    words: int = 0,
) -> Tensor:  # fmt: skip
    """Positions of the class token, ``words`` caption words and the ``height x width`` patches
    (``height`` counts the rows of all frames): ``(N,)``, ``(N, 2)`` or ``(N, 3)``."""
    if axes == 1:
        return torch.arange(1 + words + height * width, device=device)
    grid = grid_positions(height, width, prefix=1 + words, device=device)
    rows = height // frames  # patch rows per frame
    on_grid = grid[:, :1] >= 0
    in_frame = torch.where(on_grid, grid % torch.tensor([rows, width], device=device), grid)
    if axes == 2:
        return in_frame
    frame = torch.where(on_grid, grid[:, :1] // rows, PREFIX)  # (N, 1)
    placed = torch.cat([frame, in_frame], dim=-1) + torch.where(on_grid, words, 0)
    text = torch.arange(words, device=device)[:, None].expand(-1, 3)  # word i at (i, i, i)
    return torch.cat([placed[:1], text, placed[1 + words :]])


def check_layout(
    encoding: str, family: str, axes: int, frames: int, window: int | None, words: int = 0
) -> None:
    """UsageError unless the ViT can lay its positions out for this encoding."""
    if frames < 1:
        raise UsageError(f"frames must be >= 1 (1 = a plain image), got {frames}")
    if axes > 3:
        raise UsageError(
            f"encoding {encoding!r} reads {axes} axes; a ViT gives at most 3 (t, row, col): "
            f"build it with axes <= 3"
        )
    if window is not None and words:
        raise UsageError(
            "window attention runs on the image grid and has no slot for caption words; set "
            "model.window to 0 for a captioned data set"
        )
    if window is not None and frames > 1:
        raise UsageError(
            f"window attention runs on one image's grid, not a clip of {frames} frames; "
            f"set model.window to 0 or use a single-frame data set"
        )
    if window is not None and axes != 2 and family != "none":
        raise UsageError(
            f"window attention runs on the image grid; encoding {encoding!r} reads {axes} "
            "axes: use a 2D encoding (sincos2d, learned2d, rope2d, swin, irpe, irpe_nd with "
            "axes=2) or none"
        )

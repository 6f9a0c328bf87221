"""M-RoPE: one rotary encoding for text, images and video (Qwen2-VL, Wang et al. 2024; the
interleaved layout of Qwen3-VL).

A token's position has one coordinate per axis, ``(t, h, w)`` by default; the head's ``d/2``
rotated pairs are shared out among the axes by ``sections`` (pairs per axis, summing to d/2),
and pair ``i`` turns by ``p_axis(i) * f_i``. So ``q . k`` depends on the offset along every axis.

- ``layout="chunked"`` (Qwen2-VL): the first ``sections[0]`` pairs follow axis 0, the next
  ``sections[1]`` axis 1, ... (Qwen2-VL's ``mrope_section [16, 24, 24]`` of 64 pairs).
- ``layout="interleaved"`` (Qwen3-VL): pairs go to the axes in turn, ``0, 1, 2, 0, 1, 2, ...``,
  an axis dropping out of the rotation once its section is used up, so every axis sees high
  and low frequencies alike.
- ``frequencies="shared"`` (Qwen's): ``f_i = base^(-2i/d)`` over the whole head, each pair
  keeping its own frequency whatever axis it follows. ``"per_axis"``: each axis's pairs restart
  the 1D spectrum over their own channels, ``base^(-2j/(2 n_axis))`` for its j-th pair, which
  is RoPE-ViT's axial form.
- Positions: ``(N,)`` means every axis at that value (a text token, ``t = h = w``), which makes
  M-RoPE exactly ``rope`` (interleaved pairs, the same base). ``(N, A)`` gives each axis in
  the order of ``sections``; with A = 2 given as (col, row), sections ``[d/4, d/4]``, chunked,
  per-axis frequencies and base 100 it is exactly axial ``rope2d`` (which turns the first half
  of the pairs by the column). Negative coordinates (prefix tokens at ``(-1, -1)``) are not
  rotated.
- ``mrope_positions`` builds a mixed sequence's ``(N, 3)`` positions by Qwen2-VL's rule: text
  tokens count on; an image or video of ``t x h x w`` patches starting at ``s`` takes
  ``(s + ti, s + hi, s + wi)``, and the token after it starts at one past the largest
  coordinate the image used.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from posenc_cli.encodings.base import PositionEncoding
from posenc_cli.encodings.rope import rope_frequencies
from posenc_cli.errors import UsageError
from posenc_cli.kernels.rotary import rotate_pairs

Layout = Literal["chunked", "interleaved"]
Frequencies = Literal["shared", "per_axis"]


def pair_axes(sections: Sequence[int], layout: Layout) -> list[int]:
    """The axis each rotated pair follows."""
    if layout == "chunked":
        return [axis for axis, n in enumerate(sections) for _ in range(n)]
    left, order = list(sections), []
    while any(left):
        for axis in range(len(left)):
            if left[axis]:
                order.append(axis)
                left[axis] -= 1
    return order


class MultiAxisRope(PositionEncoding):
    """RoPE whose pairs follow one axis each of a (t, h, w) or any A-axis position."""

    family = "rotary"
    dims = 3  # any number of axes: sequences, grids, video
    per_layer = False

    def __init__(
        self,
        *,
        sections: list[int] | None = None,
        layout: Layout = "chunked",
        frequencies: Frequencies = "shared",
        base: float = 10000.0,
        heads: int = 8,
        head_dim: int = 64,
        causal: bool = False,
    ) -> None:
        super().__init__(heads=heads, head_dim=head_dim, causal=causal)
        pairs = head_dim // 2
        if sections is None:  # Qwen2-VL's split in proportion: a quarter to t, the rest halved
            t = pairs // 4
            sections = [t, (pairs - t) // 2, pairs - t - (pairs - t) // 2]
        if head_dim % 2 or sum(sections) != pairs or min(sections) < 0:
            raise UsageError(
                f"mrope: sections {sections} must be >= 0 and sum to head_dim / 2 = {pairs} "
                f"(head_dim {head_dim} must be even)"
            )
        if layout not in ("chunked", "interleaved"):
            raise UsageError(f"mrope: layout must be 'chunked' or 'interleaved', got {layout!r}")
        if frequencies not in ("shared", "per_axis"):
            raise UsageError(
                f"mrope: frequencies must be 'shared' or 'per_axis', got {frequencies!r}"
            )
        if base <= 1:
            raise UsageError(f"mrope: base must be > 1, got {base}")
        self.sections, self.layout, self.frequency_rule, self.base = (
            list(sections), layout, frequencies, base,
        )  # fmt: skip
        self.axes = len(sections)
        self.axis_of_pair = torch.tensor(pair_axes(sections, layout))  # (d/2,)
        if frequencies == "shared":
            self.inv_freq = rope_frequencies(head_dim, base)  # (d/2,)
        else:
            freq = torch.zeros(pairs, dtype=torch.float64)
            for axis, n in enumerate(sections):  # each axis restarts the spectrum on its pairs
                freq[self.axis_of_pair == axis] = rope_frequencies(2 * n, base)
            self.inv_freq = freq

    def extra_repr(self) -> str:
        return (
            f"sections={self.sections}, layout={self.layout}, "
            f"frequencies={self.frequency_rule}, base={self.base}"
        )

    def angles(self, positions: Tensor) -> Tensor:
        """Float64 ``(N, d/2)``: each pair's coordinate times its frequency."""
        axes = len(self.sections)
        p = positions.to(torch.float64)
        if p.dim() == 1:
            p = p[:, None].expand(-1, axes)  # a text token: every axis at its position
        if p.shape[-1] != axes:
            raise UsageError(
                f"mrope: positions have {p.shape[-1]} axes but sections name {axes}; give "
                f"(N,) or (N, {axes}) positions"
            )
        p = p.clamp(min=0)  # prefix tokens at -1 stay unrotated
        chosen = p[:, self.axis_of_pair.to(p.device)]  # (N, d/2)
        return chosen * self.inv_freq.to(p.device)

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        qa, ka = self.angles(q_pos), self.angles(k_pos)
        return (
            rotate_pairs(q, qa.cos().to(q.dtype), qa.sin().to(q.dtype), "interleaved"),
            rotate_pairs(k, ka.cos().to(k.dtype), ka.sin().to(k.dtype), "interleaved"),
        )


def mrope_positions(segments: Sequence[tuple]) -> Tensor:
    """``(N, 3)`` positions of a mixed sequence: ``("text", n)`` or ``("image", t, h, w)``."""
    rows: list[list[int]] = []
    start = 0
    for segment in segments:
        if segment[0] == "text":
            rows += [[start + i] * 3 for i in range(segment[1])]
            start += segment[1]
        elif segment[0] == "image":
            _, t, h, w = segment
            rows += [[start + a, start + b, start + c]
                     for a in range(t) for b in range(h) for c in range(w)]  # fmt: skip
            start += max(t, h, w)  # one past the largest coordinate used
        else:
            raise UsageError(f"mrope_positions: unknown segment {segment[0]!r}; text or image")
    return torch.tensor(rows, dtype=torch.long)

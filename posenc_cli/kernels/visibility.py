"""Which keys a query of a 1D sequence sees: the causal mask and the sparse patterns of text.

The patterns are those of the image grid (``models/window.py``) on one axis, so one recipe key
means the same on text and images. Offsets are the query's position minus the key's:

- local window (``window`` k, odd): offsets ``-(k // 2) d .. (k // 2) d`` in steps of the
  ``dilation`` d (Longformer's sliding and dilated windows, Beltagy et al. 2020). Under a causal
  mask only the ``k // 2 + 1`` offsets at or behind the query remain.
- strided lattice (``stride`` s): also the offsets ``-(k // 2) s .. (k // 2) s`` in steps of s,
  Child et al. 2019's strided pattern bounded to ``k`` points so the cost stays ``O(N k)``.
- global tokens (``global_tokens`` G): the first G tokens see, and are seen by, every token
  (BigBird's ITC form; under a causal mask, every token before them and after them).

Except for the global tokens, whether a key is seen depends on the offset alone, which is what
lets the blocked kernel fold a pattern into a bias table of distances as it folds the causal mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Band:
    """A sparse pattern on a sequence (see the module docstring); its options were checked by
    ``models/window.check_pattern``."""

    window: int
    dilation: int = 1
    stride: int | None = None
    global_tokens: int = 0

    @property
    def reach(self) -> int:
        """The largest offset a local or lattice slot spans."""
        return (self.window // 2) * max(self.dilation, self.stride or 1)

    def on_offset(self, offset: Tensor) -> Tensor:
        """Whether a slot of the window or the lattice sits at ``offset`` (query minus key)."""
        half = self.window // 2
        seen = (offset.abs() <= half * self.dilation) & (offset % self.dilation == 0)
        if self.stride is not None:  # not in place: FlexAttention's mask_mod calls this too
            seen = seen | ((offset.abs() <= half * self.stride) & (offset % self.stride == 0))
        return seen


@dataclass(frozen=True)
class Visibility:
    """The causal mask and the band together; ``start`` is the first key's position, from which
    the global tokens are counted."""

    causal: bool = False
    band: Band | None = None
    start: int = 0

    @property
    def hides_some(self) -> bool:
        """Whether some query does not see every key."""
        return self.causal or self.band is not None

    def sees(self, q_at: Tensor, k_at: Tensor) -> Tensor:
        """Whether the query at position ``q_at`` sees the key at ``k_at``, elementwise: on
        broadcast blocks, or on one pair inside a FlexAttention mask_mod (so nothing in place).
        Only for a visibility that ``hides_some``."""
        seen = k_at <= q_at if self.causal else None
        if self.band is not None:
            on_band = self.band.on_offset(q_at - k_at)
            if self.band.global_tokens:
                end = self.start + self.band.global_tokens
                on_band = on_band | (q_at < end) | (k_at < end)
            seen = on_band if seen is None else seen & on_band
        return seen

    def hidden(self, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """``(rows, keys)``, True where the query may not see the key; None where every query
        sees every key (most tiles of a causal staircase: filling their bias would copy it whole
        for nothing)."""
        if not self.hides_some:
            return None
        hidden = ~self.sees(q_pos[:, None], k_pos[None, :])
        return hidden if bool(hidden.any()) else None

    def hidden_distance(self, distance: Tensor) -> Tensor:
        """Per key-minus-query ``distance``, whether every such pair is hidden, globals aside."""
        hidden = distance > 0 if self.causal else torch.zeros_like(distance, dtype=torch.bool)
        if self.band is not None:
            hidden |= ~self.band.on_offset(-distance)
        return hidden

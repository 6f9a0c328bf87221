"""Rotary position embedding (RoPE) with context-extension scalings.

Su et al. 2021/2024, "RoFormer: Enhanced Transformer with Rotary Position Embedding": channel pair
``i`` of q and k at position ``m`` is turned by the angle ``m * theta_i``,
``theta_i = base^(-2i/r)`` for ``i = 0 .. r/2 - 1`` (``r`` the rotated width), so ``q_m . k_n``
depends on ``m - n`` only.

Scalings of the frequencies, for running past the trained context ``original_length``, are in
``rope_scaling`` with their formulas: ``linear`` (position interpolation), ``ntk`` (static base
change), ``dynamic`` (HF's dynamic NTK), ``yarn`` (with DeepSeek's ``mscale`` pair), ``llama3``
and ``longrope``. The attention factor of yarn and longrope multiplies cos and sin, so both q and
k carry it and the logits grow by its square. ``partial="proportional"`` divides the exponent by
the head dimension instead of the rotated width when ``fraction < 1``.

Conventions:

- ``layout="interleaved"`` rotates pairs ``(x0, x1), (x2, x3), ...`` as RoFormer and the source
  article do; ``layout="half"`` rotates ``(x_i, x_{i + r/2})`` as GPT-NeoX and LLaMA checkpoints do.
  The two are equal up to a fixed permutation of the rotated channels (interleaved channel ``2i``
  is half-split channel ``i``, channel ``2i + 1`` is ``i + r/2``), which is absorbed by the q/k
  projections when training from scratch; a checkpoint must state which one it used.
- ``fraction`` of the head dims is rotated, rounded down to an even count (GPT-NeoX
  ``rotary_pct``); the first ``r`` channels rotate, the rest pass unchanged. With YaRN only the
  rotated channels carry the temperature, as in the reference code, which scales cos and sin.
- Angles are computed in float64 and cast to the input dtype. Tables are ``(N, r/2)`` and
  broadcast over batch and heads. Interleaved float32/float64 inputs are rotated as one complex
  multiplication (one pass over q); the half layout and other dtypes (float16, bfloat16) use
  ``x * cos + swap(x) * sin``.
- Tables are cached per (first position, length, device, dtype) on the CPU. On accelerators they
  are recomputed every call: finding the cache key would need a host sync, and an ``(N, r/2)``
  table is a few tiny kernels.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from posenc_cli.encodings.base import PositionEncoding
from posenc_cli.encodings.rope_scaling import (
    LENGTH_DEPENDENT,
    RopeScaling,
    Scaling,
    frequencies,
)
from posenc_cli.encodings.rope_scaling import mscale as yarn_mscale  # noqa: F401 (re-exported)
from posenc_cli.errors import UsageError
from posenc_cli.kernels.positions import consecutive
from posenc_cli.kernels.rotary import Layout, rotary_tables, rotate_pairs

Partial = Literal["neox", "proportional"]

_MAX_CACHED = 16  # table entries kept per instance; a training run needs one or two


def rope_frequencies(
    rotary_dim: int,
    base: float = 10000.0,
    scaling: Scaling = "none",
    factor: float = 1.0,
    original_length: int = 2048,
    *,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
) -> Tensor:
    """Angular frequency of each rotated pair, float64 ``(rotary_dim/2,)``, for the scalings
    that need nothing but a factor (see ``rope_scaling`` for all of them)."""
    settings = RopeScaling(scaling, factor, original_length, beta_fast, beta_slow)
    return frequencies(settings, rotary_dim // 2, base, rotary_dim)[0]


def apply_rotary(
    x: Tensor,
    positions: Tensor,
    inv_freq: Tensor,
    layout: Layout = "interleaved",
    *,
    scale: float = 1.0,
) -> Tensor:
    """Rotate the first ``2 * len(inv_freq)`` channels of ``x`` ``(..., N, d)`` at ``positions``
    ``(N,)``; the remaining channels pass unchanged. ``scale`` multiplies the rotated part."""
    r = 2 * inv_freq.shape[0]
    cos, sin = rotary_tables(positions, inv_freq, x.dtype, scale)
    return _rotate_prefix(x, cos, sin, layout, r)


def _rotate_prefix(x: Tensor, cos: Tensor, sin: Tensor, layout: Layout, r: int) -> Tensor:
    if r == x.shape[-1]:
        return rotate_pairs(x, cos, sin, layout)
    return torch.cat([rotate_pairs(x[..., :r], cos, sin, layout), x[..., r:]], dim=-1)


def _consecutive_start(positions: Tensor) -> int | None:
    """``start`` if ``positions`` is ``start, start + 1, ...`` (read on the host), else None."""
    if positions.numel() == 0 or not consecutive(positions):
        return None
    return int(positions[0])


class RotaryEmbedding(PositionEncoding):
    """RoPE: q and k are rotated by position; no parameters, shared by every layer."""

    family = "rotary"
    extrapolates = True
    per_layer = False

    def __init__(
        self,
        *,
        layout: Layout = "interleaved",
        base: float = 10000.0,
        fraction: float = 1.0,
        partial: Partial = "neox",
        scaling: Scaling = "none",
        factor: float = 1.0,
        original_length: int = 2048,
        beta_fast: float = 32.0,
        beta_slow: float = 1.0,
        mscale: float = 0.0,
        mscale_all_dim: float = 0.0,
        low_freq_factor: float = 1.0,
        high_freq_factor: float = 4.0,
        short_factor: list[float] | None = None,
        long_factor: list[float] | None = None,
        heads: int = 8,
        head_dim: int = 64,
        causal: bool = False,
    ) -> None:
        super().__init__(heads=heads, head_dim=head_dim, causal=causal)
        if layout not in ("interleaved", "half"):
            raise UsageError(f"rope: layout must be 'interleaved' or 'half', got {layout!r}")
        if partial not in ("neox", "proportional"):
            raise UsageError(f"rope: partial must be 'neox' or 'proportional', got {partial!r}")
        if base <= 1:
            raise UsageError(f"rope: base must be > 1, got {base}")
        if not 0 < fraction <= 1:
            raise UsageError(f"rope: fraction must be in (0, 1], got {fraction}")
        rotary_dim = int(fraction * head_dim + 1e-9) // 2 * 2  # 0.58 * 100 = 57.99...
        if rotary_dim < 2:
            raise UsageError(
                f"rope: fraction={fraction} of head_dim={head_dim} rotates no channel pair; "
                f"raise fraction to at least {2 / head_dim:.3g}"
            )
        self.scaling_settings = RopeScaling(
            scaling,
            factor,
            original_length,
            beta_fast,
            beta_slow,
            mscale,
            mscale_all_dim,
            low_freq_factor,
            high_freq_factor,
            None if short_factor is None else tuple(short_factor),
            None if long_factor is None else tuple(long_factor),
        )
        # the exponent's denominator: the rotated width (GPT-NeoX) or the whole head
        self.exponent_dim = rotary_dim if partial == "neox" else head_dim
        self.scaling_settings.check(rotary_dim // 2, self.exponent_dim)
        self.layout: Layout = layout
        self.base = base
        self.fraction = fraction
        self.partial: Partial = partial
        self.scaling: Scaling = scaling
        self.factor = factor
        self.original_length = original_length
        self.rotary_dim = rotary_dim
        # plain float64 attributes, not buffers: module.half() must not round the frequencies
        self.inv_freq, self.mscale = self.frequencies_at(None)  # (r/2,), attention factor
        self._cache: dict[tuple, tuple[Tensor, Tensor]] = {}

    def frequencies_at(self, length: int | None) -> tuple[Tensor, float]:
        """Inverse frequencies and attention factor for a sequence of ``length`` positions."""
        return frequencies(
            self.scaling_settings, self.rotary_dim // 2, self.base, self.exponent_dim, length
        )

    def extra_repr(self) -> str:
        return (
            f"layout={self.layout}, base={self.base}, rotary_dim={self.rotary_dim}, "
            f"scaling={self.scaling}, factor={self.factor}"
        )

    def tables(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """Scaled cos and sin at ``positions``, each ``(N, r/2)``; cached on the CPU."""
        if self.scaling in LENGTH_DEPENDENT:  # the frequencies follow the sequence's length
            length = int(positions.max()) + 1 if positions.numel() else 0
            inv_freq, factor = self.frequencies_at(length)
            return rotary_tables(positions, inv_freq, dtype, factor)
        if positions.device.type != "cpu":
            return rotary_tables(positions, self.inv_freq, dtype, self.mscale)
        start = _consecutive_start(positions)
        if start is None:
            return rotary_tables(positions, self.inv_freq, dtype, self.mscale)
        key = (start, positions.numel(), positions.device, dtype)
        if key not in self._cache:
            if len(self._cache) >= _MAX_CACHED:
                self._cache.pop(next(iter(self._cache)))  # oldest first
            self._cache[key] = rotary_tables(positions, self.inv_freq, dtype, self.mscale)
        return self._cache[key]

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        k_cos, k_sin = self.tables(k_pos, k.dtype)
        nq = q_pos.numel()
        tail = k_pos[k_pos.numel() - nq :]
        if q_pos is k_pos or (
            q.dtype == k.dtype
            and q_pos.data_ptr() == tail.data_ptr()
            and q_pos.shape == tail.shape
            and q_pos.stride() == tail.stride()
        ):
            # the queries are the last keys (Attention's contract): reuse the key table
            q_cos, q_sin = k_cos[k_pos.numel() - nq :], k_sin[k_pos.numel() - nq :]
        else:
            q_cos, q_sin = self.tables(q_pos, q.dtype)
        r = self.rotary_dim
        return (
            _rotate_prefix(q, q_cos, q_sin, self.layout, r),
            _rotate_prefix(k, k_cos, k_sin, self.layout, r),
        )

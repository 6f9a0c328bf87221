"""RoPE's context-extension scalings: the inverse frequencies and the attention factor of each,
as the published formulas (and HF ``transformers``' ``modeling_rope_utils``) define them.

Notation: ``r`` rotated channels, pair ``i = 0 .. r/2 - 1``, exponent ``e_i = 2i / D`` with
``D = r`` (GPT-NeoX's partial rotary, HF's default) or ``D`` the full head dimension (the
``proportional`` variant), plain frequency ``theta_i = base^(-e_i)``; ``s`` the factor, ``L0``
the original (trained) context, ``L`` the current one.

- ``linear`` (Chen et al. 2023): ``theta_i / s``.
- ``ntk`` (bloc97 2023, static): ``base' = base * s^(D / (D - 2))``.
- ``dynamic`` (HF's dynamic NTK): while ``L <= L0`` the plain frequencies; past it
  ``base' = base * (s L / L0 - (s - 1))^(D / (D - 2))``, recomputed as ``L`` grows.
- ``yarn`` (Peng et al. 2023): pairs with more than ``beta_fast`` turns over ``L0`` keep
  ``theta_i``, pairs with fewer than ``beta_slow`` take ``theta_i / s``, a linear ramp between
  (ends: floor and ceil of ``D ln(L0 / (2 pi beta)) / (2 ln base)``, clamped to ``[0, r - 1]``
  as the reference and HF clamp them, so the ramp may end past the last pair).
  Attention factor ``m(s, 1)`` with ``m(s, k) = 0.1 k ln s + 1``; with DeepSeek's ``mscale``
  and ``mscale_all_dim`` set, ``m(s, mscale) / m(s, mscale_all_dim)``.
- ``llama3`` (Meta's Llama 3.1): wavelength ``w_i = 2 pi / theta_i``; ``w_i < L0 / high`` keeps
  ``theta_i``, ``w_i > L0 / low`` takes ``theta_i / s``, and between them
  ``(1 - a) theta_i / s + a theta_i`` with ``a = (L0 / w_i - low) / (high - low)``.
- ``longrope`` (Ding et al. 2024, Phi-3): ``theta_i / f_i`` with ``f`` the ``long_factor`` list
  once ``L > L0`` and the ``short_factor`` list before; attention factor
  ``sqrt(1 + ln s / ln L0)`` (1 when ``s <= 1``), ``s`` the given factor.

The attention factor multiplies cos and sin, so q and k both carry it (HF's convention).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from posenc_cli.errors import UsageError

Scaling = Literal["none", "linear", "ntk", "dynamic", "yarn", "llama3", "longrope"]
SCALINGS: tuple[str, ...] = Scaling.__args__  # type: ignore[attr-defined]
LENGTH_DEPENDENT = ("dynamic", "longrope")  # frequencies change with the current length


@dataclass(frozen=True)
class RopeScaling:
    kind: Scaling = "none"
    factor: float = 1.0
    original_length: int = 2048
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0
    mscale: float = 0.0  # yarn, DeepSeek's pair; 0 = unset
    mscale_all_dim: float = 0.0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0
    short_factor: tuple[float, ...] | None = None  # longrope, one per rotated pair
    long_factor: tuple[float, ...] | None = None

    def check(self, pairs: int, exponent_dim: int) -> None:
        """One-line errors for impossible settings, before any table is built."""
        kind = self.kind
        if kind not in SCALINGS:
            raise UsageError(f"rope: scaling must be one of {', '.join(SCALINGS)}, got {kind!r}")
        if kind == "none" and self.factor != 1:
            raise UsageError(
                f"rope: factor={self.factor} needs a scaling; set scaling to one of "
                f"{', '.join(SCALINGS[1:])}"
            )
        if self.factor < 1:
            raise UsageError(
                f"rope: factor must be >= 1 (new context / trained context), got {self.factor}"
            )
        if self.original_length < 1:
            raise UsageError(f"rope: original_length must be >= 1, got {self.original_length}")
        if kind in ("ntk", "dynamic") and exponent_dim < 4:
            raise UsageError(f"rope: scaling={kind} needs at least 4 rotated channels")
        if not 0 < self.beta_slow < self.beta_fast:
            raise UsageError(
                f"rope: need 0 < beta_slow < beta_fast, got {self.beta_slow} and {self.beta_fast}"
            )
        if kind == "llama3" and not 0 < self.low_freq_factor < self.high_freq_factor:
            raise UsageError(
                "rope: llama3 needs 0 < low_freq_factor < high_freq_factor, got "
                f"{self.low_freq_factor} and {self.high_freq_factor}"
            )
        if kind == "longrope":
            for name in ("short_factor", "long_factor"):
                values = getattr(self, name)
                if values is None or len(values) != pairs or min(values) <= 0:
                    raise UsageError(
                        f"rope: longrope needs {name} as {pairs} positive numbers (one per "
                        f"rotated pair), got {values!r}"
                    )


def mscale(factor: float, k: float = 1.0) -> float:
    """YaRN's ``0.1 k ln(s) + 1`` (1 when not extending)."""
    return 0.1 * k * math.log(factor) + 1.0 if factor > 1 else 1.0


def ramp_end(beta: float, exponent_dim: int, base: float, length: int) -> float:
    """Pair index (fractional) that completes ``beta`` turns over ``length`` positions."""
    return exponent_dim * math.log(length / (beta * 2 * math.pi)) / (2 * math.log(base))


def plain(pairs: int, base: float, exponent_dim: int) -> Tensor:
    """``base^(-2i / D)``, float64 ``(pairs,)``."""
    return base ** (-torch.arange(0, 2 * pairs, 2, dtype=torch.float64) / exponent_dim)


def frequencies(
    s: RopeScaling, pairs: int, base: float, exponent_dim: int, length: int | None = None
) -> tuple[Tensor, float]:
    """``(inverse frequencies float64 (pairs,), attention factor)`` at the current ``length``
    (read by the length-dependent scalings only; None = the original length)."""
    theta = plain(pairs, base, exponent_dim)
    length = s.original_length if length is None else length
    if s.kind == "none":
        return theta, 1.0
    if s.kind == "linear":
        return theta / s.factor, 1.0
    if s.kind == "ntk":
        grown = base * s.factor ** (exponent_dim / (exponent_dim - 2))
        return plain(pairs, grown, exponent_dim), 1.0
    if s.kind == "dynamic":
        if length <= s.original_length:
            return theta, 1.0
        ratio = s.factor * length / s.original_length - (s.factor - 1)
        return plain(pairs, base * ratio ** (exponent_dim / (exponent_dim - 2)), exponent_dim), 1.0
    if s.kind == "yarn":
        low = max(math.floor(ramp_end(s.beta_fast, exponent_dim, base, s.original_length)), 0)
        top = math.ceil(ramp_end(s.beta_slow, exponent_dim, base, s.original_length))
        high = min(top, 2 * pairs - 1)
        high = high + 0.001 if low == high else high  # the reference's guard
        ramp = ((torch.arange(pairs, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        inv = theta * (1 - ramp) + theta / s.factor * ramp  # ramp 1: interpolated
        if s.mscale and s.mscale_all_dim:
            return inv, mscale(s.factor, s.mscale) / mscale(s.factor, s.mscale_all_dim)
        return inv, mscale(s.factor)
    if s.kind == "llama3":
        wavelength = 2 * math.pi / theta
        low_wave = s.original_length / s.low_freq_factor  # longer than this: interpolate
        high_wave = s.original_length / s.high_freq_factor  # shorter than this: keep
        a = (s.original_length / wavelength - s.low_freq_factor) / (
            s.high_freq_factor - s.low_freq_factor
        )
        blended = (1 - a) * theta / s.factor + a * theta
        inv = torch.where(wavelength > low_wave, theta / s.factor, blended)
        return torch.where(wavelength < high_wave, theta, inv), 1.0
    # longrope
    factors = s.long_factor if length > s.original_length else s.short_factor
    inv = theta / torch.tensor(factors, dtype=torch.float64)
    factor = (
        1.0 if s.factor <= 1 else math.sqrt(1 + math.log(s.factor) / math.log(s.original_length))
    )
    return inv, factor

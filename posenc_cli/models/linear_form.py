"""Softmax replaced by kernelised (linear) attention, with the position kept as the encoding
gives it (issue 18: RPE fused with linear attention; ``kernels/linear_attention.py``):

- rotary (``rope``): RoFormer's section 3.3 form, the features turned by the encoding's own
  frequencies;
- a content-free bias of ``j - i`` alone (``toeplitz``: ALiBi, T5, KERPLE, Sandwich): its
  ``exp``, a positive relative weight, applied as a Toeplitz product by FFT (Luo et al. 2021),
  the bias asked of the encoding once per distance;
- no logit term at all (``none`` and the absolute encodings, which act on the input): plain
  linear attention (the rotary form at angle 0).

Any other encoding is refused with its name: its term needs the softmax's pairwise logits.
"""

from __future__ import annotations

from torch import Tensor

from posenc_cli.encodings.base import PositionEncoding
from posenc_cli.errors import UsageError
from posenc_cli.kernels.linear_attention import (
    rotary_linear_attention,
    toeplitz_linear_attention,
)

PLAIN = ("none", "absolute")  # families that leave the logits alone


def supports(encoding: PositionEncoding) -> bool:
    """Whether linear attention can keep this encoding's position information."""
    rotary = encoding.family == "rotary" and hasattr(encoding, "inv_freq") and encoding.dims == 1
    toeplitz = encoding.toeplitz and encoding.dims == 1
    return encoding.family in PLAIN or rotary or toeplitz


def supports_class(cls: type[PositionEncoding]) -> bool:
    """The same, from the class alone (the registry's 1D encodings that qualify by default)."""
    if cls.dims != 1 or cls.causal_only:
        return False
    return cls.family in PLAIN or cls.toeplitz is True or cls.__name__ == "RotaryEmbedding"


def attend(
    encoding: PositionEncoding, q: Tensor, k: Tensor, v: Tensor, positions: Tensor, causal: bool
) -> Tensor:
    """``(B, H, N, d)`` linear attention of un-rotated q and k at 1D ``positions``."""
    if not supports(encoding):
        raise UsageError(
            f"attention 'linear' keeps position only as rotation (rope), as a bias of j - i "
            f"(alibi, t5, kerple, sandwich) or in the input (none, absolute); "
            f"{type(encoding).__name__} has another term: use attention 'softmax'"
        )
    if encoding.family == "rotary":
        return rotary_linear_attention(q, k, v, positions, encoding.inv_freq, causal)
    if encoding.family in PLAIN:
        still = q.new_zeros(q.shape[-1] // 2)  # angle 0: the rotary form is plain attention
        return rotary_linear_attention(q, k, v, positions, still, causal)
    if not bool((positions.diff() == 1).all()):
        raise UsageError(
            "attention 'linear' with a bias of j - i needs consecutive positions (its weights "
            "are a Toeplitz product over token indices); drop model.random_positions"
        )
    table, _ = encoding.distance_table(q, positions, positions)  # (H, 2N - 1) by j - i
    weights = table.flip(-1).exp()  # by i - j, as the Toeplitz product reads them
    return toeplitz_linear_attention(q, k, v, weights, causal)

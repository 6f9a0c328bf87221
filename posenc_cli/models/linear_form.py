"""Softmax replaced by kernelised (linear) attention, with the position kept as the encoding
gives it (issue 18: RPE fused with linear attention; ``kernels/linear_attention.py``):

- rotary (``rope`` over the whole head, interleaved, without an attention factor or a
  length-dependent scaling): RoFormer's section 3.3 form, the features turned by the encoding's
  own frequencies;
- a content-free bias of ``j - i`` alone (``toeplitz``: ALiBi, T5, KERPLE, Sandwich): its
  ``exp``, a positive relative weight, applied as a Toeplitz product by FFT (Luo et al. 2021),
  the bias asked of the encoding once per distance;
- no logit term at all (``none`` and the absolute encodings, which act on the input): plain
  linear attention (the rotary form at angle 0).

Any other encoding is refused with its name: its term needs the softmax's pairwise logits.
"""

from __future__ import annotations

from torch import Tensor

from posenc_cli.encodings.base import BackboneFacts, PositionEncoding
from posenc_cli.encodings.rope import RotaryEmbedding
from posenc_cli.encodings.rope_scaling import LENGTH_DEPENDENT
from posenc_cli.errors import UsageError
from posenc_cli.kernels.linear_attention import (
    rotary_linear_attention,
    toeplitz_linear_attention,
)
from posenc_cli.kernels.positions import consecutive

PLAIN = ("none", "absolute")  # families that leave the logits alone


def rotation(encoding: PositionEncoding) -> Tensor | None:
    """The frequencies the features are turned by, when the encoding's rotation is nothing more:
    RoPE over the whole head, interleaved pairs, no attention factor and no length-dependent
    scaling. xPos's decay, a partial or NeoX-layout RoPE, YaRN's factor would be dropped or
    misread by RoFormer's form, so they get None (and are refused)."""
    if type(encoding) is not RotaryEmbedding:
        return None
    whole = encoding.rotary_dim == encoding.head_dim and encoding.layout == "interleaved"
    plain = encoding.mscale == 1.0 and encoding.scaling not in LENGTH_DEPENDENT
    return encoding.inv_freq if whole and plain else None


def supports(encoding: PositionEncoding) -> bool:
    """Whether linear attention can keep this encoding's position information."""
    if encoding.dims != 1:
        return False
    return encoding.family in PLAIN or encoding.toeplitz or rotation(encoding) is not None


def supports_class(cls: type[PositionEncoding]) -> bool:
    """The same for a registry class at its default settings (the profiler's list)."""
    facts = BackboneFacts(dim=64, heads=4, causal=cls.causal_only)
    return not cls.causal_only and supports(cls(**facts.for_encoding(cls, {})))


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
    frequencies = rotation(encoding)
    if frequencies is not None:
        return rotary_linear_attention(q, k, v, positions, frequencies, causal)
    if encoding.family in PLAIN:
        still = q.new_zeros(q.shape[-1] // 2)  # angle 0: the rotary form is plain attention
        return rotary_linear_attention(q, k, v, positions, still, causal)
    if not consecutive(positions):
        raise UsageError(
            "attention 'linear' with a bias of j - i needs consecutive positions (its weights "
            "are a Toeplitz product over token indices); drop model.random_positions"
        )
    table, _ = encoding.distance_table(q, positions, positions)  # (H, 2N - 1) by j - i
    weights = table.flip(-1).exp()  # by i - j, as the Toeplitz product reads them
    return toeplitz_linear_attention(q, k, v, weights, causal)

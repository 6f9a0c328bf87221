"""RoPE's scalings against values worked out here, in plain Python, from the published formulas
(HF transformers' modeling_rope_utils computes the same; it is not imported)."""

from __future__ import annotations

import math

import pytest
import torch

from posenc_cli.encodings import build_encoding
from posenc_cli.errors import UsageError


def rope(head_dim: int = 8, **params):
    return build_encoding("rope", heads=1, head_dim=head_dim, **params)


def table_at(enc, positions: list[int]):
    """(cos, sin) at the positions, float64 ``(N, r/2)``, attention factor included."""
    return enc.tables(torch.tensor(positions), torch.float64)


def test_llama3_keeps_short_waves_divides_long_ones_and_blends_between():
    enc = rope(scaling="llama3", factor=8.0, original_length=64, low_freq_factor=1.0,
               high_freq_factor=4.0)  # fmt: skip
    theta = [10000 ** (-2 * i / 8) for i in range(4)]  # 1, 0.1, 0.01, 0.001
    # wavelengths 6.3, 62.8, 628, 6283 against 64 / 4 = 16 and 64 / 1 = 64
    a = (64 / (2 * math.pi / theta[1]) - 1) / (4 - 1)
    want = [theta[0], (1 - a) * theta[1] / 8 + a * theta[1], theta[2] / 8, theta[3] / 8]
    assert enc.inv_freq.tolist() == pytest.approx(want, rel=1e-12)
    assert enc.mscale == 1.0


def test_longrope_switches_lists_at_the_original_length_and_scales_attention():
    enc = rope(head_dim=4, scaling="longrope", factor=4.0, original_length=16,
               short_factor=[1.0, 2.0], long_factor=[4.0, 8.0])  # fmt: skip
    theta = [1.0, 0.01]  # 10000^(-2i/4)
    factor = math.sqrt(1 + math.log(4) / math.log(16))
    cos, sin = table_at(enc, list(range(10)))  # length 10 <= 16: the short list
    assert cos[9].tolist() == pytest.approx([factor * math.cos(9 * t / f) for t, f in
                                             zip(theta, [1.0, 2.0], strict=True)])  # fmt: skip
    cos, sin = table_at(enc, list(range(32)))  # past 16: the long list
    assert sin[31].tolist() == pytest.approx([factor * math.sin(31 * t / f) for t, f in
                                              zip(theta, [4.0, 8.0], strict=True)])  # fmt: skip


def test_dynamic_ntk_grows_the_base_with_the_current_length():
    enc = rope(scaling="dynamic", factor=2.0, original_length=16)
    plain = [10000 ** (-2 * i / 8) for i in range(4)]
    cos, _ = table_at(enc, list(range(16)))
    assert cos[15].tolist() == pytest.approx([math.cos(15 * t) for t in plain])
    grown = 10000 * (2 * 32 / 16 - (2 - 1)) ** (8 / (8 - 2))
    theta = [grown ** (-2 * i / 8) for i in range(4)]
    cos, _ = table_at(enc, list(range(32)))
    assert cos[31].tolist() == pytest.approx([math.cos(31 * t) for t in theta])


def test_yarn_attention_factor_with_deepseeks_mscale_pair():
    plain = rope(scaling="yarn", factor=40.0, original_length=64)
    assert plain.mscale == pytest.approx(0.1 * math.log(40) + 1)
    paired = rope(scaling="yarn", factor=40.0, original_length=64, mscale=1.0,
                  mscale_all_dim=0.707)  # fmt: skip
    want = (0.1 * 1.0 * math.log(40) + 1) / (0.1 * 0.707 * math.log(40) + 1)
    assert paired.mscale == pytest.approx(want)
    assert torch.equal(paired.inv_freq, plain.inv_freq)  # the pair changes the factor only


def test_proportional_partial_rotary_divides_by_the_head_dimension():
    neox = rope(fraction=0.5)  # 4 of 8 channels: exponents 2i / 4
    proportional = rope(fraction=0.5, partial="proportional")  # exponents 2i / 8
    assert neox.inv_freq.tolist() == pytest.approx([1.0, 10000 ** (-2 / 4)])
    assert proportional.inv_freq.tolist() == pytest.approx([1.0, 10000 ** (-2 / 8)])
    assert torch.equal(rope(partial="proportional").inv_freq, rope().inv_freq)  # whole head


def test_recipe_style_values_convert_and_bad_lists_are_one_line():
    enc = rope(head_dim=4, scaling="longrope", factor="2", original_length="8",
               short_factor=["1", "1.5"], long_factor=["2", "3"])  # fmt: skip
    assert enc.scaling_settings.long_factor == (2.0, 3.0)
    with pytest.raises(UsageError, match="long_factor as 2 positive numbers"):
        rope(head_dim=4, scaling="longrope", short_factor=[1, 1], long_factor=[1, 2, 3])
    with pytest.raises(UsageError, match="low_freq_factor < high_freq_factor"):
        rope(scaling="llama3", factor=8.0, low_freq_factor=4.0, high_freq_factor=1.0)
    with pytest.raises(UsageError, match="rope.scaling: .ntk-by-parts. is not one of"):
        rope(scaling="ntk-by-parts")

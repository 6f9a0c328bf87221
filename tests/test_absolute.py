"""Absolute encodings against the published formula and their documented limits."""

from __future__ import annotations

import math

import pytest
import torch

from posenc_cli.encodings import build_encoding
from posenc_cli.encodings.absolute import sinusoidal_table
from posenc_cli.errors import UsageError


def vaswani(pos: int, channel: int, dim: int) -> float:
    """Section 3.5 of the paper, one entry at a time."""
    i = channel // 2
    angle = pos / 10000 ** (2 * i / dim)
    return math.sin(angle) if channel % 2 == 0 else math.cos(angle)


@pytest.mark.parametrize("dim", [2, 16, 33, 128])
def test_sinusoidal_table_is_the_vaswani_formula(dim):
    table = sinusoidal_table(50, dim)
    expected = torch.tensor([[vaswani(p, c, dim) for c in range(dim)] for p in range(50)])
    assert table.shape == (50, dim)
    torch.testing.assert_close(table, expected.float(), atol=1e-6, rtol=0)


def test_source_articles_doubled_exponent_is_not_what_we_compute():
    """The article's loop uses 10000^(2i/d) with i already stepping by 2: channel 2 would get
    exponent 4/d instead of 2/d. Our table must differ from that reading."""
    dim = 16
    buggy = math.sin(5 / 10000 ** (2 * 2 / dim))
    assert abs(float(sinusoidal_table(6, dim)[5, 2]) - buggy) > 1e-2
    assert float(sinusoidal_table(6, dim)[5, 2]) == pytest.approx(vaswani(5, 2, dim), abs=1e-6)


def test_sinusoidal_module_adds_the_table_at_any_position():
    enc = build_encoding("sinusoidal", dim=8)
    x = torch.zeros(1, 5, 8)
    out = enc.embed(x, torch.arange(100, 105))
    torch.testing.assert_close(out[0], sinusoidal_table(105, 8)[100:], atol=1e-5, rtol=0)


def test_learned_table_past_its_length_is_a_clear_error():
    enc = build_encoding("learned", dim=8, length=16)
    enc.embed(torch.zeros(1, 16, 8), torch.arange(16))  # fits exactly
    with pytest.raises(UsageError, match="position 16 is past the table's length 16"):
        enc.embed(torch.zeros(1, 17, 8), torch.arange(17))


def test_learned_length_must_be_positive():
    with pytest.raises(UsageError, match="length must be >= 1"):
        build_encoding("learned", dim=8, length=0)

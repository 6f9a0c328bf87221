"""M-RoPE: exactly rope on text positions, exactly axial rope2d on a grid, Qwen2-VL's sections
and Qwen3-VL's interleaving, relative on every axis, and the position rule of a mixed sequence."""

from __future__ import annotations

import pytest
import torch

from posenc_cli.encodings import build_encoding
from posenc_cli.encodings.base import grid_positions
from posenc_cli.encodings.mrope import mrope_positions, pair_axes
from posenc_cli.errors import UsageError

H, D = 2, 16


def qk(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, H, n, D, generator=g, dtype=torch.float64) for _ in range(2))


def test_text_positions_make_it_rope():
    mrope = build_encoding("mrope", heads=H, head_dim=D, sections=[2, 3, 3])
    rope = build_encoding("rope", heads=H, head_dim=D)
    q, k = qk(9)
    pos = torch.arange(9) + 5
    for a, b in zip(mrope.rotate(q, k, pos, pos), rope.rotate(q, k, pos, pos), strict=True):
        torch.testing.assert_close(a, b)


def test_a_grid_with_per_axis_frequencies_makes_it_axial_rope2d():
    mrope = build_encoding("mrope", heads=H, head_dim=D, sections=[4, 4], frequencies="per_axis",
                           base=100.0)  # fmt: skip
    axial = build_encoding("rope2d", heads=H, head_dim=D, variant="axial")
    pos = grid_positions(3, 4, prefix=1)  # (row, col), the class token at (-1, -1)
    q, k = qk(len(pos))
    got = mrope.rotate(q, k, pos.flip(-1), pos.flip(-1))  # M-RoPE's axes: (col, row)
    for a, b in zip(got, axial.rotate(q, k, pos, pos), strict=True):
        torch.testing.assert_close(a, b)


def test_sections_chunked_and_interleaved():
    assert pair_axes([2, 1, 1], "chunked") == [0, 0, 1, 2]
    assert pair_axes([2, 3, 1], "interleaved") == [0, 1, 2, 0, 1, 1]
    qwen2 = build_encoding("mrope", heads=1, head_dim=128, sections=[16, 24, 24])
    assert qwen2.axis_of_pair.bincount().tolist() == [16, 24, 24]


@pytest.mark.parametrize("layout", ["chunked", "interleaved"])
def test_scores_depend_on_the_offset_along_every_axis(layout):
    enc = build_encoding("mrope", heads=H, head_dim=D, sections=[2, 3, 3], layout=layout)
    q, k = qk(1, seed=3)

    def score(a, b):
        rq, rk = enc.rotate(q, k, torch.tensor([a]), torch.tensor([b]))
        return rq @ rk.transpose(-2, -1)

    torch.testing.assert_close(score([1, 2, 3], [0, 0, 1]), score([11, 7, 5], [10, 5, 3]))
    assert not torch.allclose(score([1, 2, 3], [0, 0, 1]), score([1, 2, 4], [0, 0, 1]))


def test_a_mixed_sequence_follows_qwen2_vls_rule():
    pos = mrope_positions([("text", 3), ("image", 1, 2, 3), ("text", 2)])
    assert pos[:3].tolist() == [[0, 0, 0], [1, 1, 1], [2, 2, 2]]
    image = pos[3:9].tolist()
    assert image[0] == [3, 3, 3] and image[-1] == [3, 4, 5] and len(image) == 6
    assert pos[9:].tolist() == [[6, 6, 6], [7, 7, 7]]  # one past the image's largest, 5


def test_bad_sections_and_axes_are_one_line():
    with pytest.raises(UsageError, match="sum to head_dim / 2 = 8"):
        build_encoding("mrope", heads=H, head_dim=D, sections=[4, 4, 4])
    enc = build_encoding("mrope", heads=H, head_dim=D, sections=[4, 4])
    with pytest.raises(UsageError, match=r"give \(N,\) or \(N, 2\) positions"):
        enc.angles(torch.zeros(5, 3, dtype=torch.long))

"""The names user code imports from ``posenc_cli`` (shown in the README) exist and work."""

from __future__ import annotations

import pytest
import torch

import posenc_cli


def test_the_readme_example_runs():
    from posenc_cli import Attention, build_encoding, grid_positions

    rope = build_encoding("rope2d", heads=4, head_dim=8)
    attention = Attention(32, 4, rope)
    out = attention(torch.randn(2, 1 + 9, 32), positions=grid_positions(3, 3, prefix=1))
    assert out.shape == (2, 10, 32)


def test_every_public_name_resolves_and_others_do_not():
    for name in posenc_cli.__all__:
        assert getattr(posenc_cli, name) is not None
    assert "irpe" in posenc_cli.ENCODINGS and posenc_cli.load_recipe("quickstart").seed == 0
    with pytest.raises(AttributeError):
        posenc_cli.not_a_name  # noqa: B018


def test_every_path_the_readme_names_exists():
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    text = (root / "README.md").read_text()
    named = set(re.findall(r"(?:posenc_cli|benchmarks|recipes|docs|tests)/[\w/.-]*\w", text))
    missing = [p for p in sorted(named) if not (root / p).exists()]
    assert not missing

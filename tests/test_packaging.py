"""The package list in pyproject.toml names every subpackage, so a plain install is whole."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_subpackage_is_installed():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "posenc_cli").rglob("__init__.py")
    }
    assert found <= listed, f"add to pyproject packages: {sorted(found - listed)}"
    assert config["package-dir"]["posenc_cli.recipes"] == "recipes"

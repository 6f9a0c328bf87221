"""The recipes posenc ships: the package ``posenc_cli.recipes``, else a checkout's ``recipes/``."""

from __future__ import annotations

import typing
from importlib import resources
from pathlib import Path

if typing.TYPE_CHECKING:  # importlib.resources.abc is 3.11+; only the annotations need it
    from importlib.resources.abc import Traversable


def recipes_root() -> Traversable:
    """The shipped recipes: the package ``posenc_cli.recipes``, else ``recipes/`` of a checkout."""
    try:
        return resources.files("posenc_cli.recipes")
    except ModuleNotFoundError:  # a checkout whose install does not map the package yet
        return Path(__file__).resolve().parents[2] / "recipes"


def shipped_recipes() -> dict[str, Traversable]:
    """Short name (path without ``.yaml``, e.g. ``text/extrapolation``) -> file."""
    found: dict[str, Traversable] = {}

    def walk(folder: Traversable, prefix: str) -> None:
        for child in sorted(folder.iterdir(), key=lambda c: c.name):
            if child.is_dir() and not child.name.startswith(("_", ".")):
                walk(child, f"{prefix}{child.name}/")
            elif child.name.endswith(".yaml"):
                found[prefix + child.name.removesuffix(".yaml")] = child

    root = recipes_root()
    if root.is_dir():
        walk(root, "")
    return found

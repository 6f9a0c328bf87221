"""posenc: position encodings for Transformers, one library, one attention module.

The public API, stable across changes of layout (``tests/test_public_api.py`` pins it):

- ``ENCODINGS``, ``build_encoding(name, **params)``: the registry and its checked builder.
- ``PositionEncoding``: the hooks an encoding answers; ``WrappedEncoding`` wraps another.
- ``Attention``: the one attention module that consults an encoding's hooks.
- ``grid_positions(height, width, prefix)``: the (row, col) of image tokens.
- ``load_recipe(name_or_path, overrides)``, ``Recipe``: experiments as typed recipes.

Names are imported on first use, so ``import posenc_cli`` stays cheap for the command line.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_PUBLIC = {
    "ENCODINGS": "posenc_cli.encodings",
    "build_encoding": "posenc_cli.encodings",
    "PositionEncoding": "posenc_cli.encodings.base",
    "WrappedEncoding": "posenc_cli.encodings.base",
    "grid_positions": "posenc_cli.encodings.base",
    "Attention": "posenc_cli.models.attention",
    "load_recipe": "posenc_cli.config",
    "Recipe": "posenc_cli.config",
}
__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'posenc_cli' has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)


def __dir__() -> list[str]:
    return sorted(__all__)

"""What ``posenc list`` shows: every registry entry described from its class and signature."""

from __future__ import annotations

from typing import Any

from posenc_cli.encodings import ENCODINGS, build_encoding, user_params
from posenc_cli.params import type_name


def describe(name: str) -> dict[str, Any]:
    cls = ENCODINGS[name]
    default = build_encoding(name, dim=64, heads=4, head_dim=16)
    return {
        "name": name,
        "class": cls.__name__,
        "family": cls.family,
        "dims": cls.dims,
        "per_layer": cls.per_layer,
        "extrapolates": cls.extrapolates,
        "fused": not default.uses_value,
        "params": {
            key: {"type": type_name(annotation), "default": value}
            for key, (annotation, value) in user_params(name).items()
        },
        "summary": (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else "",
    }


def describe_all() -> list[dict[str, Any]]:
    return [describe(name) for name in ENCODINGS]

"""What a task's evaluation draws beside its table. Matplotlib is imported only when a picture
is drawn, so evaluating without ``--out`` never loads it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def curve_picture(
    result: dict[str, Any], metric: str, title: str, trained: tuple[int, int]
) -> Callable[[Path], None]:
    """A one-encoding curve of ``metric`` over the evaluated sizes (shifted ones left out)."""

    def draw(path: Path) -> None:
        from posenc_cli.plots import save_length_curves

        ok = {int(k): r for k, r in result["lengths"].items() if k.isdigit() and "error" not in r}
        ns = sorted(ok)
        curve = (ns, [ok[n][metric] for n in ns], [0.0] * len(ns))
        save_length_curves({result["encoding"]: curve}, metric, title, path, trained)

    return draw


def position_picture(by_length: dict[str, list[float]], title: str) -> Callable[[Path], None]:
    """Accuracy against answer position, one line per evaluated length."""

    def draw(path: Path) -> None:
        from posenc_cli.plots import save_position_curves

        save_position_curves(by_length, title, path)

    return draw

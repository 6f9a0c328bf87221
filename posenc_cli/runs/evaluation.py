"""What `posenc evaluate` gets from a task: the result to save, the pictures to draw first, and
a table to show. The command writes and prints; the task only computes and describes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Evaluated:
    result: dict[str, Any]  # saved (merged) into ``saved_to`` and printed by --format json
    saved_to: Path
    title: str
    columns: list[str]
    rows: list[list[str]]
    pictures: list[tuple[Path, Callable[[Path], None]]] = field(default_factory=list)
    note: str | None = None  # a line shown after the table


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

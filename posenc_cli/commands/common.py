"""What every command shares: the console, output formats, list parsing."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from rich.console import Console

from posenc_cli.errors import UsageError

console = Console()


class Format(StrEnum):
    table = "table"
    json = "json"


class CompareFormat(StrEnum):
    table = "table"
    json = "json"
    md = "md"


def int_list(text: str | None, option: str) -> list[int] | None:
    if text is None:
        return None
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(
            f"{option} {text!r}: give whole numbers separated by commas, e.g. 32,64,128"
        ) from None
    if not values or min(values) < 1:
        raise UsageError(f"{option} {text!r}: every value must be at least 1")
    return values


def check_png(out: Path | None) -> None:
    """``--out`` must name a PNG file: say so before any work is done."""
    if out is not None and out.suffix.lower() != ".png":
        raise UsageError(f"--out {out}: give a file name ending in .png")

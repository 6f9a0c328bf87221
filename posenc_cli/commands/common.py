"""What every command shares: the console, output formats, list parsing, output checks."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
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


def int_list(text: str | None, option: str, minimum: int = 1) -> list[int] | None:
    if text is None:
        return None
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(
            f"{option} {text!r}: give whole numbers separated by commas, e.g. 32,64,128"
        ) from None
    if not values or min(values) < minimum:
        raise UsageError(f"{option} {text!r}: every value must be at least {minimum}")
    return values


def check_png(out: Path | None) -> None:
    """``--out`` must name a PNG file: say so before any work is done."""
    if out is not None and out.suffix.lower() != ".png":
        raise UsageError(f"--out {out}: give a file name ending in .png")


def check_metric_options(metric: str | None, fitted_at: float | None) -> None:
    """``--metric`` among the metrics some kind has, ``--fitted-at`` a finite threshold."""
    from posenc_cli.compare import all_metrics

    if metric is not None and metric not in all_metrics():
        raise UsageError(f"--metric {metric!r}: choose one of {', '.join(all_metrics())}")
    if fitted_at is not None and not math.isfinite(fitted_at):
        raise UsageError(f"--fitted-at {fitted_at}: give a finite threshold, e.g. 0.99")


def reject_options(options: dict[str, object], reason: str) -> None:
    """Options given that do not apply to this run are an error, never silently ignored."""
    given = [name for name, value in options.items() if value is not None]
    if given:
        raise UsageError(f"{' and '.join(given)}: {reason}")


def check_writable(folder: Path, label: str, fix: str) -> None:
    """Fail before any long work if a new file cannot be made in ``folder``: the nearest folder
    that exists (the rest is created on the way) must be a directory this user may write."""
    existing = folder
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{label}: {existing} is a file, not a folder; {fix}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"{label}: no permission to write in {existing}; {fix}")


@contextmanager
def written(path: Path) -> Iterator[None]:
    """A write that fails after the checks (a full disk, a read-only mount) is one line; the
    file that stood at ``path`` is intact, since every write goes to a temporary file first."""
    try:
        yield
    except OSError as err:
        raise UsageError(
            f"{path}: could not be written ({err.strerror or err}), the file there is "
            "unchanged; free space or make the folder writable and run again"
        ) from None

"""The training loops' progress bar."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn


def progress_bar(console: Console, enabled: bool = True) -> Progress:
    """The training loops' bar: run name, bar, steps, the latest figures, time left."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[stats]}"),
        TimeRemainingColumn(),
        console=console,
        disable=not enabled,
    )

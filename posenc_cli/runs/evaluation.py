"""What `posenc evaluate` gets from a task: the result to save, the pictures to draw first, and
a table to show. The command writes and prints; the task only computes and describes."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posenc_cli.errors import UsageError
from posenc_cli.runs.checkpoint import atomic_write_json


@dataclass
class Evaluated:
    result: dict[str, Any]  # saved (merged) into ``saved_to`` and printed by --format json
    saved_to: Path
    title: str
    columns: list[str]
    rows: list[list[str]]
    pictures: list[tuple[Path, Callable[[Path], None]]] = field(default_factory=list)
    note: str | None = None  # a line shown after the table


def run_directory(path: Path) -> Path:
    """The run directory a user named: the folder itself, or the folder of its recipe.yaml."""
    if path.is_file() and path.name == "recipe.yaml":
        return path.parent
    if path.is_file():
        inside = (path.parent / "recipe.yaml").is_file()
        hint = f"its folder, {path.parent}" if inside else "a `posenc train` output folder"
        raise UsageError(f"{path}: a file, not a run directory; give {hint}")
    return path


def recipe_file(run_dir: Path) -> Path:
    """The resolved recipe a run directory holds."""
    path = run_dir / "recipe.yaml"
    if not path.is_file():
        raise UsageError(
            f"{run_dir}: not a run directory (no recipe.yaml); give a `posenc train` output folder"
        )
    return path


def natural_key(label: str) -> list:
    """``max_distance=8`` before ``max_distance=16``: numbers compare as numbers."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", label)]


def save_evaluation(path: Path, result: dict[str, Any]) -> dict[str, Any]:
    """Write ``result`` to ``path`` without losing what the file already records: its new
    lengths replace those of the same key, the others stay, in natural order. A damaged file is
    replaced. Returns what was written."""
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):  # none yet, or damaged: nothing to keep
        old = None
    merged = dict(result)
    if isinstance(old, dict) and isinstance(old.get("lengths"), dict):
        points = {**old["lengths"], **result["lengths"]}
        merged["lengths"] = {key: points[key] for key in sorted(points, key=natural_key)}
    atomic_write_json(path, merged)
    return merged

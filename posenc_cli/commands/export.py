"""``posenc export``: a sweep's results in one small JSON file, read by compare, rank, report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from posenc_cli.commands.common import check_writable, console, written
from posenc_cli.errors import UsageError


def export_command(
    runs: Annotated[
        list[Path], typer.Argument(help="Run or sweep directories, or results files to merge.")
    ],
    out: Annotated[Path, typer.Option("--out", help="The results file to write (.json).")],
) -> None:
    """Every run's evaluation and training summary in one JSON file, without checkpoints: the
    file to commit beside a README, which compare, rank and report read like the sweep itself.
    Earlier results files given beside directories are merged in: a sweep run in parts.

    Example: posenc export runs/length-gen/sort --out docs/results/length-gen/sort.json

    Example: posenc export part1.json runs/addition-rest --out addition.json
    """
    from posenc_cli.results_file import export
    from posenc_cli.runs.checkpoint import atomic_write_json

    if out.suffix.lower() != ".json":
        raise UsageError(f"--out {out}: give a file name ending in .json")
    check_writable(out.parent, f"--out {out}", "give a path in a folder you can write")
    doc = export(runs)
    out.parent.mkdir(parents=True, exist_ok=True)
    with written(out):
        atomic_write_json(out, doc)
    console.print(f"wrote {out}: {len(doc['runs'])} runs, {len(doc['diverged'])} diverged")

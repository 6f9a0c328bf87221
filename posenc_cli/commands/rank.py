"""``posenc rank``: encodings ranked across tasks by their metric past the trained range."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from posenc_cli.commands.common import (
    CompareFormat,
    check_metric_options,
    check_png,
    check_writable,
    console,
    written,
)


def rank_command(
    runs: Annotated[
        list[Path],
        typer.Argument(help="Sweep directories or results files (posenc export), one task each."),
    ],
    metric: Annotated[
        str | None,
        typer.Option("--metric", help="The metric to rank by (default: the task's first)."),
    ] = None,
    fitted_at: Annotated[
        float | None,
        typer.Option(
            "--fitted-at",
            help="Mark cells where a seed's --metric stayed below this at the longest trained "
            "length.",
        ),
    ] = None,
    format: Annotated[
        CompareFormat, typer.Option("--format", help="table, json or md")
    ] = CompareFormat.table,
    out: Annotated[
        Path | None, typer.Option("--out", help="PNG of each encoding's rank in each study.")
    ] = None,
) -> None:
    """Encodings ranked within each task by their metric past the trained range (the mean over
    the evaluated lengths beyond it, seed by seed), then by their mean rank over tasks, with
    Friedman's test of whether the rankings differ at all (Kazemnejad et al. 2023's summary).

    Example: posenc rank runs/length-gen/copy runs/length-gen/reverse runs/length-gen/parity
    --metric exact_match --fitted-at 0.99
    """
    from posenc_cli.ranking import markdown, notes, rank, rows

    check_metric_options(metric, fitted_at)
    check_png(out)
    if out is not None:
        check_writable(out.parent, f"--out {out}", "give a path in a folder you can write")
    result = rank(runs, metric, fitted_at)
    if out is not None:
        from posenc_cli.plots import save_rank_chart

        with written(out):
            save_rank_chart(result, out)
    if format is CompareFormat.json:
        print(json.dumps(result))
        return
    if format is CompareFormat.md:
        print(markdown(result), end="")
        return
    header, body = rows(result)
    table = Table(title=f"{result['metric'].replace('_', ' ')} past the trained range, ranked")
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i == 0 else "right")
    for row in body:
        table.add_row(*row)
    console.print(table)
    for line in notes(result):
        console.print(line)
    if out is not None:
        console.print(f"wrote {out}")

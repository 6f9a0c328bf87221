"""``posenc report``: the article's selection table and scenario advice, from measurements."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from posenc_cli.commands.common import CompareFormat, check_writable, console, written


def report_command(
    runs: Annotated[
        list[Path],
        typer.Argument(help="Run or sweep directories or results files (posenc export), one each."),
    ],
    profile: Annotated[
        Path | None,
        typer.Option("--profile", help="profile.json from `posenc profile --out DIR`."),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Folder for report.md, report.json and report.png."),
    ] = None,
    format: Annotated[
        CompareFormat, typer.Option("--format", help="table, json or md on stdout")
    ] = CompareFormat.table,
) -> None:
    """The source article's selection table with measured numbers in every column (1x against
    up to 4x, cost ratios to none, growth exponents, seed spread and divergence, code size,
    dimensions served), then its scenario advice beside what the measurements say.

    Example: posenc report runs/lm-extrapolation runs/length-gen/copy --profile
    docs/profile/profile.json --out docs/report
    """
    from posenc_cli.report.measure import build_report
    from posenc_cli.report.render import markdown, save_plot, terminal_tables

    if out is not None:
        check_writable(out, f"--out {out}", "give a folder you can write")
    report = build_report(runs, profile)
    text = markdown(report)
    if out is not None:
        from posenc_cli.runs.checkpoint import atomic_write_text

        with written(out):
            out.mkdir(parents=True, exist_ok=True)
            atomic_write_text(out / "report.md", text)
            atomic_write_text(out / "report.json", json.dumps(report, indent=2) + "\n")
            save_plot(report, out / "report.png")
    if format is CompareFormat.json:
        print(json.dumps(report))
    elif format is CompareFormat.md:
        print(text, end="")
    else:
        for table in terminal_tables(report):
            console.print(table)
        if out is not None:
            console.print(f"wrote {out}/report.md, report.json and report.png")

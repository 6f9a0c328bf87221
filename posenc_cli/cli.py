"""The ``posenc`` command line: a Typer app that registers the commands and turns user errors
into one line on stderr and exit status 2. The commands live in ``posenc_cli.commands``.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from posenc_cli import __version__
from posenc_cli.commands import library, profile, runs
from posenc_cli.errors import UsageError

app = typer.Typer(
    help="posenc: position encodings for Transformers, built, compared and measured.\n\n"
    "Example: posenc list",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("list")(library.list_command)
app.command("viz-bias")(library.viz_bias)
app.command("viz-buckets")(library.viz_buckets)
app.command("train")(runs.train_command)
app.command("evaluate")(runs.evaluate_command)
app.command("compare")(runs.compare_command)
app.command("profile")(profile.profile_command)


def show_version(value: bool) -> None:
    if value:
        print(f"posenc {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=show_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """posenc: position encodings for Transformers."""


def main(argv: list[str] | None = None) -> None:
    """Console entry point: a user error becomes one line on stderr and exit status 2.

    Typer (click) already answers malformed options with a usage message and exit 2.
    """
    try:
        app(args=argv, prog_name="posenc")
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)

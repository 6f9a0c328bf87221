"""The ``posenc`` command line: a Typer app that registers the commands and turns user errors
into one line on stderr and exit status 2. The commands live in ``posenc_cli.commands``.
"""

from __future__ import annotations

import errno
import sys
from typing import Annotated

import typer

from posenc_cli import __version__
from posenc_cli.allocator import keep_freed_memory
from posenc_cli.commands import export, library, profile, rank, report, runs
from posenc_cli.errors import UsageError
from posenc_cli.interrupts import INTERRUPTED, forget_handled_interrupt

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
app.command("report")(report.report_command)
app.command("rank")(rank.rank_command)
app.command("export")(export.export_command)


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
    """Console entry point: every user error, click's option errors included, becomes one line
    on stderr and exit status 2."""
    from typer import exceptions as typer_errors
    from typer._click import exceptions as click_errors  # typer vendors click

    keep_freed_memory()
    try:
        code = app(args=argv, prog_name="posenc", standalone_mode=False)
    except click_errors.NoArgsIsHelpError as err:  # bare `posenc`: the help, as before
        err.show()
        sys.exit(2)
    except click_errors.UsageError as err:  # a bad option value, a missing argument, a typo
        command = err.ctx.command_path if err.ctx else "posenc"
        fail(f"{err.format_message().rstrip('.')}; see '{command} --help'", err.exit_code)
    except click_errors.ClickException as err:
        fail(err.format_message(), err.exit_code)
    except typer_errors.Abort:
        code = INTERRUPTED
    except UsageError as err:
        fail(str(err))
    except OSError as err:
        if not user_caused(err):
            raise
        fail(file_problem(err))
    if code == INTERRUPTED:
        forget_handled_interrupt()
    sys.exit(code if isinstance(code, int) else 0)


def fail(message: str, status: int = 2) -> None:
    print("error: " + " ".join(message.split()), file=sys.stderr)
    sys.exit(status)


def user_caused(err: OSError) -> bool:
    """Faults of the user's files and folders (not bugs): a folder that cannot be written, a
    file where a folder should be, a full or read-only disk."""
    kinds = (PermissionError, FileExistsError, NotADirectoryError, IsADirectoryError)
    return isinstance(err, kinds) or err.errno in (errno.ENOSPC, errno.EROFS, errno.EDQUOT)


def file_problem(err: OSError) -> str:
    where = err.filename or "a file"
    fix = {
        errno.ENOSPC: "free some space or choose another --out",
        errno.EDQUOT: "free some space or choose another --out",
        errno.EROFS: "choose a folder on a writable disk with --out",
        errno.EEXIST: "a file of that name is in the way; remove it or choose another --out",
        errno.ENOTDIR: "a file stands where a folder is needed; choose another --out",
        errno.EISDIR: "a folder stands where a file is needed; give a file name",
    }.get(err.errno, "choose a folder you can write with --out, or fix its permissions")
    return f"cannot write {where}: {err.strerror}; {fix}"

"""Commands that run experiments: train, evaluate, compare."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from posenc_cli.commands.common import (
    CompareFormat,
    Format,
    check_metric_options,
    check_png,
    console,
    int_list,
)
from posenc_cli.errors import UsageError


def train_command(
    recipe: Annotated[
        str, typer.Argument(help="Recipe file or shipped name (text/extrapolation).")
    ],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="Dotted KEY=VALUE overrides, e.g. train.steps=200.")
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Run (or sweep) directory.")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue a stopped run.")] = False,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Print the resolved recipe and the runs; train nothing."),
    ] = False,
    jobs: Annotated[
        int,
        typer.Option(
            "--jobs", help="Train a sweep's runs in this many processes, sharing the CPU threads."
        ),
    ] = 1,
) -> None:
    """Train a recipe (every run of its sweep), then evaluate each run at the recipe's lengths.

    Example: posenc train quickstart train.steps=300 --out runs/quick
    """
    from posenc_cli.config import dump_recipe, load_sweep
    from posenc_cli.experiments import check_jobs, default_out, run_recipe
    from posenc_cli.runs.directory import TrainingStopped
    from posenc_cli.runs.distributed import PeerLost, is_main_process
    from posenc_cli.runs.terminate import Terminated, sigterm_as_interrupt

    check_jobs(jobs)
    sweep = load_sweep(recipe, list(overrides or []))
    resolved = sweep.recipe
    if dry_run:
        print(dump_recipe(resolved), end="")
        base = out or default_out(resolved)
        names = ", ".join(name for name, _ in sweep.runs)
        print(f"# {len(sweep.runs)} run(s) into {base}: {names}")
        return
    err = Console(stderr=True)
    torchrun = int(os.environ.get("WORLD_SIZE", "1")) > 1
    try:
        with sigterm_as_interrupt():
            dirs = run_recipe(sweep, out, resume, err, jobs)
    except Terminated:
        why = " (under torchrun: another rank failed, its error is above)" if torchrun else ""
        err.print(
            f"stopped by SIGTERM{why}: the last checkpoint is saved; continue with the same "
            "command and --resume",
            soft_wrap=True,
        )
        raise typer.Exit(143) from None
    except KeyboardInterrupt:
        err.print(
            "interrupted: the last checkpoint is saved; continue with the same command and --resume"
        )
        raise typer.Exit(130) from None
    except (TrainingStopped, PeerLost) as stop:
        print(f"error: {stop}", file=sys.stderr)
        raise typer.Exit(1) from None
    base = out or default_out(resolved)
    if not is_main_process():  # under torchrun only rank 0 reports
        return
    if len(dirs) > 1:
        from posenc_cli.compare import compare, metrics_of

        result = compare([base])
        show_comparison(result, metrics_of(result["kind"])[0], CompareFormat.table)
    console.print(f"runs in {base}")


def evaluate_command(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by posenc train.")],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="KEY=VALUE, e.g. eval.batches=4.")
    ] = None,
    lengths: Annotated[str | None, typer.Option("--lengths", help="e.g. 32,64,128,256")] = None,
    shift: Annotated[int | None, typer.Option("--shift", help="Add K to every position.")] = None,
    sizes: Annotated[
        str | None, typer.Option("--sizes", help="Image runs: sides in px, e.g. 32,48,64.")
    ] = None,
    shifts: Annotated[
        str | None, typer.Option("--shifts", help="Image runs: translations in px, e.g. 0,4.")
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", help="PNG curve to write.")] = None,
    misses: Annotated[
        Path | None,
        typer.Option("--misses", help="Text runs: write every missed test problem (JSON Lines)."),
    ] = None,
    by_position: Annotated[
        bool,
        typer.Option(
            "--by-position",
            help="Text runs: accuracy at each answer position, one column per length "
            "(with --out, a curve per length).",
        ),
    ] = False,
    by_count: Annotated[
        bool,
        typer.Option(
            "--by-count",
            help="Parity runs: exact match at each count of ones, every count drawn alike "
            "(saved to eval_by_count.json).",
        ),
    ] = False,
    format: Annotated[Format, typer.Option("--format", help="table or json")] = Format.table,
) -> None:
    """Score a run at the trained length and longer ones, optionally with positions shifted;
    an image run at other resolutions and on translated images.

    Example: posenc evaluate runs/quick --lengths 8,16,32,64 --shift 100
    """
    from posenc_cli.commands.common import check_writable, reject_options
    from posenc_cli.runs.evaluation import run_directory
    from posenc_cli.runs.lock import hold
    from posenc_cli.tasks import task_of_run

    check_png(out)
    run_dir = run_directory(run_dir)
    task = task_of_run(run_dir)
    given = {
        "lengths": lengths,
        "shift": shift,
        "sizes": sizes,
        "shifts": shifts,
        "out": out,
        "misses": misses,
        "by_position": by_position or None,
        "by_count": by_count or None,
    }
    reject_options(
        {
            f"--{flag.replace('_', '-')}": value
            for flag, value in given.items()
            if flag not in task.evaluate_flags
        },
        task.evaluate_hint,
    )
    if shift is not None and shift < 0:
        raise UsageError(f"--shift {shift}: give a position offset >= 0, e.g. --shift 100")
    if by_count and by_position:
        raise UsageError("--by-count and --by-position: each draws its own table; give one of them")
    options = {
        "lengths": int_list(lengths, "--lengths"),
        "shift": shift,
        "sizes": int_list(sizes, "--sizes"),
        "shifts": int_list(shifts, "--shifts", minimum=0),
        "out": out,
        "misses": misses,
        "by_position": by_position,
        "by_count": by_count,
    }
    # results are written last, so find out now, before a long evaluation, that they can be
    check_writable(
        run_dir,
        f"{run_dir} (the evaluation is saved there)",
        "make the run directory writable, or copy the run and evaluate the copy",
    )
    if out is not None:
        check_writable(out.parent, f"--out {out}", "give a path in a folder you can write")
    if misses is not None:
        if misses.is_dir():
            raise UsageError(
                f"--misses {misses}: a folder; give a file, e.g. --misses misses.jsonl"
            )
        check_writable(misses.parent, f"--misses {misses}", "give a path in a folder you can write")
    with hold(run_dir):  # no training or other evaluation writes it meanwhile
        show_evaluation(task.call("score", run_dir, list(overrides or []), options), format)


def show_evaluation(evaluated, format: Format) -> None:
    """Draw the pictures, then save the evaluation (merged: what was recorded before is kept),
    then show it: nothing is written if a picture cannot be."""
    from posenc_cli.commands.common import written
    from posenc_cli.tasks.text.evaluate import save_evaluation

    for path, draw in evaluated.pictures:
        with written(path):
            draw(path)
    with written(evaluated.saved_to):
        save_evaluation(evaluated.saved_to, evaluated.result)
    if format is Format.json:
        print(json.dumps(evaluated.result))
        return
    table = Table(title=evaluated.title)
    for column in evaluated.columns:
        table.add_column(column, justify="right")
    for row in evaluated.rows:
        table.add_row(*row)
    console.print(table)
    if evaluated.note:
        console.print(evaluated.note)


def compare_command(
    runs: Annotated[
        list[Path],
        typer.Argument(help="Run or sweep directories, or results files (posenc export)."),
    ],
    metric: Annotated[
        str | None,
        typer.Option(
            "--metric",
            help="text: token_accuracy, exact_match, loss, perplexity; image: top1, top5, loss; "
            "detection: AP, AP50, AP75, APs, APm, APl, loss",
        ),
    ] = None,
    format: Annotated[
        CompareFormat, typer.Option("--format", help="table, json or md")
    ] = CompareFormat.table,
    out: Annotated[Path | None, typer.Option("--out", help="PNG plot of metric vs length.")] = None,
    baseline: Annotated[
        str | None,
        typer.Option(
            "--baseline",
            help="Test every encoding against this one (Welch's t-test over seeds); or, where "
            "the runs are studies of the same encodings, against itself in the study named.",
        ),
    ] = None,
    fitted_at: Annotated[
        float | None,
        typer.Option(
            "--fitted-at",
            help="Count the seeds whose --metric reached this at the longest trained length.",
        ),
    ] = None,
    adjust: Annotated[
        str | None,
        typer.Option(
            "--adjust",
            help="--baseline: adjust the p-values for testing every cell at once: holm "
            "(family-wise) or bh (false discovery rate).",
        ),
    ] = None,
) -> None:
    """Encodings side by side: mean and 95% confidence interval over seeds at every evaluated
    length; with --baseline, whether each differs from it beyond the spread, the effect size
    and the seeds that would resolve it; with --fitted-at, how many seeds fitted the trained
    range, so that figures past it are read for fitted models only.

    Example: posenc compare runs/extrapolation --baseline none --format md
    """
    from posenc_cli.commands.common import check_writable, written
    from posenc_cli.compare import compare, metric_range, metrics_of
    from posenc_cli.statistics import ADJUSTMENTS

    check_png(out)
    if out is not None:
        check_writable(out.parent, f"--out {out}", "give a path in a folder you can write")
    check_metric_options(metric, fitted_at)
    if adjust is not None and (adjust not in ADJUSTMENTS or baseline is None):
        raise UsageError(
            f"--adjust {adjust!r}: adjusts the tests against a --baseline; give --baseline NAME "
            f"and one of {', '.join(ADJUSTMENTS)}"
        )
    result = compare(runs, baseline, fitted_at, metric, adjust)
    valid = metrics_of(result["kind"])
    metric = metric or valid[0]
    if metric not in valid:
        raise UsageError(f"--metric {metric!r}: choose one of {', '.join(valid)}")
    if out is not None:
        from posenc_cli.plots import save_length_curves

        series = {}
        for label, g in result["groups"].items():
            ns = [
                n
                for n in result["lengths"]
                if n.isdigit() and "error" not in g["lengths"].get(n, {"error": 1})
            ]  # shifted image columns ("32+4") are in the table, not on the size axis
            series[label] = (
                [int(n) for n in ns],
                [g["lengths"][n][metric]["mean"] for n in ns],
                [g["lengths"][n][metric]["ci95"] or 0.0 for n in ns],  # 95% CI band
            )
        trained = {
            tuple(g["train_lengths"]) for g in result["groups"].values() if g["train_lengths"]
        }
        shade = trained.pop() if len(trained) == 1 else None  # shade only a range all runs share
        title = "posenc compare: " + ", ".join(map(str, runs))
        with written(out):
            save_length_curves(series, metric, title, out, shade, metric_range(metric))
    show_comparison(result, metric, format)
    if out is not None and format is CompareFormat.table:
        console.print(f"wrote {out}")


def show_comparison(result, metric: str, format: CompareFormat) -> None:
    from posenc_cli.compare import baseline_name, markdown, rows, test_rows

    if format is CompareFormat.json:
        print(json.dumps(result))
        return
    if format is CompareFormat.md:
        print(markdown(result, metric))
        return
    name = metric.replace("_", " ")
    marks = (
        f"; ▲ ▼ better or worse than {baseline_name(result)} at 5%" if "baseline" in result else ""
    )
    title = f"{name}: mean ± 95% CI over seeds (best in bold{marks})"
    console.print(
        results_table(result, title, rows(result, metric, lambda t: f"[bold green]{t}[/]"))
    )
    if "fit" in result:
        from posenc_cli.compare import fit_note

        console.print(fit_note(result))
    if "baseline" in result:
        from posenc_cli.compare import adjust_note

        title = (
            f"{name}, minus {baseline_name(result)}: Welch's t-test, the paired t-test over the "
            f"seeds both share (* resolved at 5%{adjust_note(result)}), Cohen's d, seeds per "
            "encoding to resolve it"
        )
        console.print(results_table(result, title, test_rows(result, metric)))


def results_table(result, title: str, body: list[list[str]]) -> Table:
    from posenc_cli.compare import column_title

    table = Table(title=title)
    table.add_column("encoding")
    table.add_column("seeds", justify="right")
    for n in result["lengths"]:
        table.add_column(column_title(result, n), justify="right")
    for row in body:
        table.add_row(*row)
    return table

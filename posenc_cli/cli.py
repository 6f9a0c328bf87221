"""The ``posenc`` command line: thin Typer wrappers around plain functions.

Every user mistake raises ``UsageError``; ``main`` prints it as one line and exits 2.
"""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from posenc_cli import __version__
from posenc_cli.errors import UsageError

app = typer.Typer(
    help="posenc: position encodings for Transformers, built, compared and measured.\n\n"
    "Example: posenc list",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()


class Format(str, Enum):
    table = "table"
    json = "json"


class CompareFormat(str, Enum):
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


@app.command("list")
def list_command(
    format: Annotated[Format, typer.Option("--format", help="table or json")] = Format.table,
) -> None:
    """List every encoding: family, 1D/2D, parameters, extrapolation, fused path.

    Example: posenc list --format json
    """
    from posenc_cli.catalog import describe_all

    rows = describe_all()
    if format is Format.json:
        print(json.dumps(rows, indent=2))
        return
    table = Table(title="posenc encodings")
    for column in ("name", "family", "dims", "parameters (defaults)", "extrapolates", "fused SDPA"):
        table.add_column(column)
    for row in rows:
        params = ", ".join(f"{k}={v['default']!r}" for k, v in row["params"].items()) or "-"
        table.add_row(
            row["name"],
            row["family"],
            f"{row['dims']}D",
            params,
            "yes" if row["extrapolates"] else "no",
            "yes" if row["fused"] else "no (value term)",
        )
    console.print(table)


@app.command("viz-bias")
def viz_bias(
    encoding: Annotated[str, typer.Argument(help="Encoding name, see `posenc list`.")],
    params: Annotated[
        list[str] | None, typer.Argument(help="Encoding parameters as KEY=VALUE.")
    ] = None,
    length: Annotated[int, typer.Option("--length", help="Number of positions N.")] = 64,
    heads: Annotated[int, typer.Option("--heads", help="Attention heads.")] = 4,
    head_dim: Annotated[int, typer.Option("--head-dim", help="Channels per head.")] = 32,
    seed: Annotated[int, typer.Option("--seed", help="Seed for content and projections.")] = 0,
    out: Annotated[Path | None, typer.Option("--out", help="PNG file to write.")] = None,
    format: Annotated[Format, typer.Option("--format", help="table or json")] = Format.table,
) -> None:
    """Show the positional part of the attention logits as an N x N map per head.

    For `sinusoidal` it shows U_i.U_j beside U_i^T W_q^T W_k U_j with random projections: the
    relative pattern of the raw sinusoid vanishes after projection.

    Example: posenc viz-bias t5 num_buckets=16 --length 48 --out t5.png
    """
    from posenc_cli.bias_maps import positional_logits, toeplitz_error
    from posenc_cli.encodings import build_encoding
    from posenc_cli.params import parse_assignments

    for name, value in (("--length", length), ("--heads", heads), ("--head-dim", head_dim)):
        if value < 1:
            raise UsageError(f"{name} must be at least 1, got {value}")
    if out is not None and out.suffix.lower() != ".png":
        raise UsageError(f"--out {out}: give a file name ending in .png")
    user = parse_assignments(params or [])
    enc = build_encoding(
        encoding, dim=heads * head_dim, heads=heads, head_dim=head_dim, **user
    ).eval()
    maps = positional_logits(enc, length, seed)
    if out is not None:
        from posenc_cli.plots import save_bias_maps

        settings = ", ".join(f"{k}={v}" for k, v in user.items())
        title = f"{encoding}({settings})  N={length}, heads={heads}, d={head_dim}"
        save_bias_maps(maps, title, out)
    if format is Format.json:
        payload = {
            "encoding": encoding,
            "params": user,
            "length": length,
            "heads": heads,
            "head_dim": head_dim,
            "maps": {m.title: m.maps.tolist() for m in maps},
            "toeplitz_error": {m.title: [toeplitz_error(h) for h in m.maps] for m in maps},
            "png": str(out) if out else None,
        }
        print(json.dumps(payload))
        return
    table = Table(title=f"{encoding}: positional logits over {length} positions")
    for column in ("map", "head", "min", "max", "depends only on j - i"):
        table.add_column(column)
    for m in maps:
        for h, head_map in enumerate(m.maps):
            error = toeplitz_error(head_map)
            relative = "yes" if error < 1e-4 else f"no (diagonal spread {error:.0%})"
            label = str(h) if m.maps.shape[0] > 1 else "all"
            table.add_row(
                m.title, label, f"{head_map.min():.3g}", f"{head_map.max():.3g}", relative
            )
    console.print(table)
    if out is not None:
        console.print(f"wrote {out}")


@app.command("viz-buckets")
def viz_buckets(
    encoding: Annotated[str, typer.Argument(help="t5, shaw, deberta (1D); irpe, swin (2D).")],
    params: Annotated[
        list[str] | None, typer.Argument(help="Encoding parameters as KEY=VALUE.")
    ] = None,
    length: Annotated[int, typer.Option("--length", help="1D: number of positions N.")] = 64,
    grid: Annotated[str, typer.Option("--grid", help="2D: HEIGHTxWIDTH patches.")] = "14x14",
    query: Annotated[
        str | None, typer.Option("--query", help="2D: ROW,COL of the query (default: centre).")
    ] = None,
    all_methods: Annotated[
        bool, typer.Option("--all-methods", help="iRPE: euclidean, quant, cross, product.")
    ] = False,
    out: Annotated[Path | None, typer.Option("--out", help="PNG file to write.")] = None,
    format: Annotated[Format, typer.Option("--format", help="table or json")] = Format.table,
) -> None:
    """Show which bucket every relative position falls in.

    1D encodings: bucket id against relative position (key - query) and the N x N map.
    2D encodings: the bucket of every key patch for one query patch.

    Example: posenc viz-buckets irpe --grid 14x14 --all-methods --out irpe.png
    """
    from posenc_cli import bucket_maps as bm
    from posenc_cli.encodings import build_encoding, encoding_class
    from posenc_cli.params import parse_assignments

    if length < 1:
        raise UsageError(f"--length must be at least 1, got {length}")
    if out is not None and out.suffix.lower() != ".png":
        raise UsageError(f"--out {out}: give a file name ending in .png")
    user = parse_assignments(params or [])
    two_d = encoding_class(encoding).dims == 2
    if all_methods and encoding != "irpe":
        raise UsageError("--all-methods compares iRPE's methods; use it with irpe")
    if all_methods and "method" in user:
        raise UsageError("--all-methods draws every method; drop method=... or --all-methods")
    variants = (
        [{**user, "method": m} for m in ("euclidean", "quant", "cross", "product")]
        if all_methods
        else [user]
    )
    maps = []
    for variant in variants:
        enc = build_encoding(encoding, dim=64, heads=1, head_dim=64, **variant)
        name = variant.get("method", encoding) if all_methods else encoding
        if two_d:
            height, width = bm.parse_grid(grid)
            where = bm.parse_query(query, height, width)
            maps += bm.grid_buckets(enc, height, width, where, name)
        else:
            maps.append(bm.sequence_buckets(enc, length, name))
    settings = ", ".join(f"{k}={v}" for k, v in user.items())
    shape = f"grid {grid}" if two_d else f"N={length}"
    title = f"{encoding}({settings})  {shape}"
    if out is not None:
        from posenc_cli.plots import save_bucket_maps

        save_bucket_maps(maps, title, out)
    if format is Format.json:
        payload = {
            "encoding": encoding,
            "params": user,
            "maps": [
                {
                    "title": m.title,
                    "num_buckets": m.count,
                    "used": m.used,
                    "ids": m.ids.tolist(),
                    **({"query": list(m.query)} if m.query else {"relative_from": -(length - 1)}),
                }
                for m in maps
            ],
            "png": str(out) if out else None,
        }
        print(json.dumps(payload))
        return
    for m in maps:
        console.print(render_buckets(m))
    if out is not None:
        console.print(f"wrote {out}")


def render_buckets(m) -> Table:
    """A terminal picture: 2D ids on the grid with the query highlighted; 1D runs of equal ids."""
    title = f"{m.title}: {m.count} buckets, {m.used} used"
    if m.query is not None:
        height, width = m.ids.shape
        table = Table(title=title, show_header=False, box=None, padding=(0, 0))
        for _ in range(width):
            table.add_column(justify="right", width=4)
        for r in range(height):
            cells = [
                f"[bold reverse red]{int(v):>3}[/]" if (r, c) == m.query else f"{int(v):>3}"
                for c, v in enumerate(m.ids[r])
            ]
            table.add_row(*cells)
        return table
    table = Table(title=title)
    table.add_column("relative positions (key - query)")
    table.add_column("bucket", justify="right")
    n = (len(m.ids) + 1) // 2
    start = 0
    for i in range(1, len(m.ids) + 1):
        if i == len(m.ids) or m.ids[i] != m.ids[start]:
            lo, hi = start - (n - 1), i - 1 - (n - 1)
            table.add_row(str(lo) if lo == hi else f"{lo} .. {hi}", str(int(m.ids[start])))
            start = i
    return table


@app.command("train")
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
) -> None:
    """Train a recipe (every run of its sweep), then evaluate each run at the recipe's lengths.

    Example: posenc train quickstart train.steps=300 --out runs/quick
    """
    from posenc_cli.config import dump_recipe, expand_sweep, load_recipe
    from posenc_cli.experiments import default_out, run_recipe
    from posenc_cli.train import TrainingStopped

    resolved = load_recipe(recipe, list(overrides or []))
    if dry_run:
        print(dump_recipe(resolved), end="")
        runs = expand_sweep(resolved)
        base = out or default_out(resolved)
        print(f"# {len(runs)} run(s) into {base}: " + ", ".join(name for name, _ in runs))
        return
    err = Console(stderr=True)
    try:
        dirs = run_recipe(resolved, out, resume, err)
    except KeyboardInterrupt:
        err.print(
            "interrupted: the last checkpoint is saved; continue with the same command and --resume"
        )
        raise typer.Exit(130) from None
    except TrainingStopped as stop:
        print(f"error: {stop}", file=sys.stderr)
        raise typer.Exit(1) from None
    base = out or default_out(resolved)
    if len(dirs) > 1:
        from posenc_cli.compare import compare

        show_comparison(compare([base]), "token_accuracy", CompareFormat.table)
    console.print(f"runs in {base}")


@app.command("evaluate")
def evaluate_command(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by posenc train.")],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="KEY=VALUE, e.g. eval.batches=4.")
    ] = None,
    lengths: Annotated[str | None, typer.Option("--lengths", help="e.g. 32,64,128,256")] = None,
    shift: Annotated[int | None, typer.Option("--shift", help="Add K to every position.")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="PNG curve to write.")] = None,
    format: Annotated[Format, typer.Option("--format", help="table or json")] = Format.table,
) -> None:
    """Score a run at the trained length and longer ones, optionally with positions shifted.

    Example: posenc evaluate runs/quick --lengths 8,16,32,64 --shift 100
    """
    from posenc_cli.evaluate import evaluate_run

    if out is not None and out.suffix.lower() != ".png":
        raise UsageError(f"--out {out}: give a file name ending in .png")
    result = evaluate_run(run_dir, list(overrides or []), int_list(lengths, "--lengths"), shift)
    if out is not None:
        from posenc_cli.plots import save_length_curves

        ok = {int(n): r for n, r in result["lengths"].items() if "error" not in r}
        ns = sorted(ok)
        save_length_curves(
            {result["encoding"]: (ns, [ok[n]["token_accuracy"] for n in ns], [0.0] * len(ns))},
            "token_accuracy",
            f"{run_dir} (shift {result['shift']})",
            out,
            tuple(result["train_lengths"]),
        )
    if format is Format.json:
        print(json.dumps(result))
        return
    table = Table(
        title=f"{run_dir}: {result['encoding']}, trained on lengths "
        f"{result['train_lengths'][0]}-{result['train_lengths'][1]}, shift "
        f"{result['shift']}"
    )
    for column in ("length", "loss", "perplexity", "token accuracy", "exact match"):
        table.add_column(column, justify="right")
    for n, r in result["lengths"].items():
        if "error" in r:
            table.add_row(n, "cannot run", "", "", r["error"][:60])
            continue
        table.add_row(
            n,
            f"{r['loss']:.4f}",
            f"{r['perplexity']:.3f}",
            f"{r['token_accuracy']:.4f}",
            f"{r['exact_match']:.4f}",
        )
    if "stream" in result:
        s = result["stream"]
        table.add_row(
            "stream", f"{s['loss']:.4f}", f"{s['perplexity']:.3f}", f"{s['token_accuracy']:.4f}", ""
        )
    console.print(table)


@app.command("compare")
def compare_command(
    runs: Annotated[list[Path], typer.Argument(help="Run or sweep directories.")],
    metric: Annotated[
        str, typer.Option("--metric", help="token_accuracy, exact_match, loss, perplexity")
    ] = "token_accuracy",
    format: Annotated[
        CompareFormat, typer.Option("--format", help="table, json or md")
    ] = CompareFormat.table,
    out: Annotated[Path | None, typer.Option("--out", help="PNG plot of metric vs length.")] = None,
) -> None:
    """Encodings side by side: mean and spread over seeds at every evaluated length.

    Example: posenc compare runs/extrapolation --format md --out extrapolation.png
    """
    from posenc_cli.compare import METRICS, compare

    if metric not in METRICS:
        raise UsageError(f"--metric {metric!r}: choose one of {', '.join(METRICS)}")
    if out is not None and out.suffix.lower() != ".png":
        raise UsageError(f"--out {out}: give a file name ending in .png")
    result = compare(runs)
    if out is not None:
        from posenc_cli.plots import save_length_curves

        series = {}
        for label, g in result["groups"].items():
            ns = [n for n in result["lengths"] if "error" not in g["lengths"].get(n, {"error": 1})]
            series[label] = (
                [int(n) for n in ns],
                [g["lengths"][n][metric]["mean"] for n in ns],
                [g["lengths"][n][metric]["std"] for n in ns],
            )
        save_length_curves(series, metric, "posenc compare: " + ", ".join(map(str, runs)), out)
    show_comparison(result, metric, format)
    if out is not None and format is CompareFormat.table:
        console.print(f"wrote {out}")


def show_comparison(result, metric: str, format: CompareFormat) -> None:
    from posenc_cli.compare import cell, markdown

    if format is CompareFormat.json:
        print(json.dumps(result))
        return
    if format is CompareFormat.md:
        print(markdown(result, metric))
        return
    table = Table(title=f"{metric.replace('_', ' ')}: mean ± std over seeds (best in bold)")
    table.add_column("encoding")
    table.add_column("seeds", justify="right")
    for n in result["lengths"]:
        table.add_column(f"n={n}", justify="right")
    for label, g in result["groups"].items():
        cells = []
        for n in result["lengths"]:
            text = cell(g["lengths"].get(n, {"error": ""}), metric)
            best = result["best"].get(n, {}).get(metric) == label
            cells.append(f"[bold green]{text}[/]" if best else text)
        table.add_row(label, str(len(g["seeds"])), *cells)
    console.print(table)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: a user error becomes one line on stderr and exit status 2.

    Typer (click) already answers malformed options with a usage message and exit 2.
    """
    try:
        app(args=argv, prog_name="posenc")
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)

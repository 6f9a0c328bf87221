"""Commands that show the library: list, viz-bias, viz-buckets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from posenc_cli.commands.common import Format, check_png, console, reject_options
from posenc_cli.errors import UsageError
from posenc_cli.viz_budget import (
    check_bias_memory,
    check_clip_size,
    check_grid_memory,
    check_length_memory,
)

if TYPE_CHECKING:
    pass

DEFAULT_LENGTH, DEFAULT_GRID = 64, "14x14"  # viz-buckets, 1D and 2D


def list_command(
    format: Annotated[Format, typer.Option("--format", help="table or json")] = Format.table,
) -> None:
    """List every encoding: family, 1D/2D, parameters, extrapolation, fused path.

    Example: posenc list --format json
    """
    from posenc_cli.catalog import describe_all
    from posenc_cli.encodings import dims_name

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
            dims_name(row["dims"]),
            params,
            "yes" if row["extrapolates"] else "no",
            "yes" if row["fused"] else "no (value term)",
        )
    console.print(table)


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
    from posenc_cli.encodings import build_encoding, encoding_class
    from posenc_cli.params import parse_assignments

    for name, value in (("--length", length), ("--heads", heads), ("--head-dim", head_dim)):
        if value < 1:
            raise UsageError(f"{name} must be at least 1, got {value}")
    check_png(out)
    user = parse_assignments(params or [])
    if encoding_class(encoding).dims == 2:
        raise UsageError(
            f"viz-bias draws sequence encodings; for {encoding} use "
            f"`posenc viz-buckets {encoding} --grid 14x14`"
        )
    enc = build_encoding(
        encoding, dim=heads * head_dim, heads=heads, head_dim=head_dim, **user
    ).eval()
    check_bias_memory(encoding, enc, length, seed, format is Format.json, out is not None)
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


def viz_buckets(
    encoding: Annotated[
        str, typer.Argument(help="t5, shaw, deberta (1D); irpe, swin (2D); irpe_nd (N-D).")
    ],
    params: Annotated[
        list[str] | None, typer.Argument(help="Encoding parameters as KEY=VALUE.")
    ] = None,
    length: Annotated[
        int | None, typer.Option("--length", help="1D: number of positions N (default 64).")
    ] = None,
    grid: Annotated[
        str | None,
        typer.Option(
            "--grid", help="2D: HEIGHTxWIDTH patches (default 14x14); a clip: FRAMESxHxW."
        ),
    ] = None,
    query: Annotated[
        str | None,
        typer.Option("--query", help="ROW,COL of the query (a clip: T,ROW,COL; default centre)."),
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
    N-D encodings on a clip (--grid FRAMESxHxW): the same, one panel per frame.

    Example: posenc viz-buckets irpe --grid 14x14 --all-methods --out irpe.png
    Example: posenc viz-buckets irpe_nd --grid 4x8x8 --query 1,4,4 --out clip.png
    """
    from posenc_cli import bucket_maps as bm
    from posenc_cli.encodings import build_encoding, encoding_class
    from posenc_cli.params import parse_assignments

    check_png(out)
    user = parse_assignments(params or [])
    dims = encoding_class(encoding).dims
    two_d = dims >= 2
    clip = dims == 3 and grid is not None and grid.count("x") == 2
    if two_d:
        reject_options(
            {"--length": length}, f"{encoding} is a 2D encoding; give its grid with --grid HxW"
        )
    else:
        reject_options(
            {"--grid": grid, "--query": query},
            f"{encoding} is a 1D encoding; give its positions with --length N "
            "(grids are for irpe and swin)",
        )
    length = DEFAULT_LENGTH if length is None else length
    grid = DEFAULT_GRID if grid is None else grid
    if length < 1:
        raise UsageError(f"--length must be at least 1, got {length}")
    if all_methods and encoding not in ("irpe", "irpe_nd"):
        raise UsageError("--all-methods compares iRPE's methods; use it with irpe or irpe_nd")
    if all_methods and "method" in user:
        raise UsageError("--all-methods draws every method; drop method=... or --all-methods")
    variants = (
        [{**user, "method": m} for m in ("euclidean", "quant", "cross", "product")]
        if all_methods
        else [user]
    )
    built = [
        (
            build_encoding(encoding, dim=64, heads=1, head_dim=64, **variant),
            variant.get("method", encoding) if all_methods else encoding,
        )
        for variant in variants
    ]
    as_json, png = format is Format.json, out is not None
    if clip:
        shape = bm.parse_grid(grid, sides=3)
        where = bm.parse_query(query, *shape)
        check_clip_size(grid, shape)
        maps = [m for enc, name in built for m in bm.clip_buckets(enc, shape, where, name)]
    elif two_d:
        height, width = bm.parse_grid(grid)
        where = bm.parse_query(query, height, width)
        check_grid_memory(encoding, built, grid, height, width, as_json, png)
        maps = [m for enc, name in built for m in bm.grid_buckets(enc, height, width, where, name)]
    else:
        check_length_memory(encoding, built, length, as_json, png)
        maps = [bm.sequence_buckets(enc, length, name) for enc, name in built]
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
                    **(
                        {"query": list(m.query), "query_in_this_map": m.mark_query}
                        if m.query
                        else {"relative_from": -(length - 1)}
                    ),
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
                f"[bold reverse red]{int(v):>3}[/]"
                if m.mark_query and (r, c) == m.query
                else f"{int(v):>3}"
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

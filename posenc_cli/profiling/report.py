"""``posenc profile`` output: rich tables, the JSON document and the log-log plots.

The JSON document (``SCHEMA``) is what scripts rely on: its keys only ever grow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from posenc_cli.encodings import encoding_class
from posenc_cli.profiling.sweep import BASELINE, Point, Result, to_json
from posenc_cli.report.article import FAMILY as ARTICLE_FAMILY
from posenc_cli.report.article import says

SCHEMA = "posenc.profile/1"


def document(meta: dict[str, Any], results: list[Result]) -> dict[str, Any]:
    return {"schema": SCHEMA, **meta, "results": to_json(results)}


def last_good(result: Result) -> Point | None:
    good = [p for p in result.points if p.error is None]
    return good[-1] if good else None


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _exp(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _giga(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e9:.3f}"


def _mega(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:.2f}"


def encoding_table(title: str, columns: tuple[str, ...]) -> Table:
    """A table with an encoding column wide enough to read, the figures right-aligned."""
    table = Table(title=title, title_justify="left")
    for col in columns:
        if col == "encoding":
            table.add_column(col, min_width=10)
        else:
            table.add_column(col, justify="right")
    return table


def cost_table(results: list[Result], title: str) -> Table:
    """Counts, one row per encoding at the largest size it ran: what the model costs and what
    the encoding adds to it (differences from ``none`` at the same size)."""
    table = encoding_table(
        title, ("encoding", "size", "params", "+params", "GMACs", "train", "+MMACs", "+Mops")
    )
    table.caption = (
        "GMACs: one forward; train: forward + backward; +: what the encoding adds over none"
    )
    for r in results:
        p = last_good(r)
        if p is None:
            table.add_row(r.encoding, "fails", *["-"] * 6)
            continue
        enc_macs = None if p.encoding_flops is None else p.encoding_flops // 2
        enc_ops = None
        if p.encoding_elementwise is not None and p.encoding_gathers is not None:
            enc_ops = p.encoding_elementwise + p.encoding_gathers
        table.add_row(
            r.encoding,
            str(p.size),
            f"{r.parameters:,}",
            f"{r.encoding_parameters:,}",
            _giga(p.forward_flops // 2 if p.forward_flops is not None else None),
            _giga(p.train_flops // 2 if p.train_flops is not None else None),
            _mega(enc_macs),
            _mega(enc_ops),
        )
    return table


def speed_table(results: list[Result]) -> Table:
    """Peak memory and latency at the largest size each encoding ran, with growth exponents."""
    table = encoding_table(
        "memory and time (ratios to none measured in this run)",
        ("encoding", "peak MB", "x none", "ms", "IQR", "x none", "mem exp", "time exp"),
    )
    for r in results:
        p = last_good(r)
        if p is None:
            table.add_row(r.encoding, "fails", *["-"] * 6)
            continue
        ms = "-" if p.time_median_s is None else f"{1e3 * p.time_median_s:.2f}"
        iqr = "-" if p.time_iqr_s is None else f"{1e3 * p.time_iqr_s:.2f}"
        table.add_row(
            r.encoding,
            _mb(p.peak_bytes),
            _ratio(p.memory_ratio),
            ms,
            iqr,
            _ratio(p.time_ratio),
            _exp(r.memory_exponent),
            _exp(r.time_exponent),
        )
    return table


def ratio_table(results: list[Result], sizes: list[int], unit: str = "tokens") -> Table:
    """Time ratio to ``none`` at every size (memory ratio after the slash); "fails" where an
    encoding could not run."""
    table = Table(title="time / memory as a multiple of none, per size", title_justify="left")
    table.add_column("encoding")
    for size in sizes:
        table.add_column(f"{size}px" if unit == "px" else f"N={size}", justify="right")
    for r in results:
        cells = []
        for p in r.points:
            if p.error:
                cells.append("fails")
            else:
                cells.append(f"{_ratio(p.time_ratio)} / {_ratio(p.memory_ratio)}")
        table.add_row(r.encoding, *cells)
    return table


def selection_rows(results: list[Result], sizes: list[int]) -> list[dict[str, Any]]:
    """The article's two columns beside what was measured, one row per encoding."""
    rows = []
    for r in results:
        if r.encoding == BASELINE:
            continue
        family = ARTICLE_FAMILY.get(r.encoding)
        p = last_good(r)
        ran = [q.size for q in r.points if q.error is None]
        rows.append(
            {
                "encoding": r.encoding,
                "article_family": family,
                "article_compute": says(r.encoding, "compute complexity"),
                "article_long_sequences": says(r.encoding, "long sequences"),
                "time_ratio": None if p is None else p.time_ratio,
                "time_exponent": r.time_exponent,
                "memory_ratio": None if p is None else p.memory_ratio,
                "memory_exponent": r.memory_exponent,
                "at_size": None if p is None else p.size,
                "largest_size_run": max(ran) if ran else None,
                "fails_from": next((q.size for q in r.points if q.error), None),
                "extrapolates": encoding_class(r.encoding).extrapolates,
            }
        )
    return rows


def selection_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(
        title="the article's selection table, measured (x none at the largest size run; "
        "growth = time / memory exponent)",
        title_justify="left",
    )
    for col in ("encoding", "compute", "time", "long seq.", "memory", "growth", "extrap."):
        table.add_column(col, justify="right" if col in ("time", "memory") else "left")
    for row in rows:
        growth = f"{_exp(row['time_exponent'])} / {_exp(row['memory_exponent'])}"
        if row["fails_from"] is not None:
            growth += f", fails at {row['fails_from']}"
        table.add_row(
            row["encoding"],
            row["article_compute"],
            _ratio(row["time_ratio"]),
            row["article_long_sequences"],
            _ratio(row["memory_ratio"]),
            growth,
            "yes" if row["extrapolates"] else "no",
        )
    table.caption = (
        "compute, long seq.: the article's words for the family; time, memory, growth: measured"
    )
    return table


def write_plots(results: list[Result], out: Path, label: str, size_name: str) -> list[Path]:
    from posenc_cli.plots import save_loglog

    metrics = (
        ("time", "time_median_s", "median step time (s)", "time_exponent"),
        ("memory", "peak_bytes", "peak tensor memory (bytes)", "memory_exponent"),
        ("flops", "flops", "FLOPs per step", None),
    )
    written = []
    for stem, key, ylabel, slope_key in metrics:
        series, slopes = {}, {}
        for r in results:
            points = [p for p in r.points if getattr(p, key)]
            if points:
                series[r.encoding] = ([p.tokens for p in points], [getattr(p, key) for p in points])
                slopes[r.encoding] = getattr(r, slope_key) if slope_key else None
        if series:
            path = out / f"{stem}.png"
            written.append(save_loglog(series, size_name, ylabel, f"{label}: {stem}", path, slopes))
    return written


def markdown(results: list[Result], selection: list[dict[str, Any]] | None) -> str:
    """The measurements as Markdown tables (for a README), at the largest size each ran."""
    lines = [
        "| encoding | size | +enc params | GMACs | +enc MMACs | +enc Mops | peak MB (x none) "
        "| ms (x none) | time exp | mem exp |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        p = last_good(r)
        if p is None:
            lines.append(f"| {r.encoding} | fails | | | | | | | | |")
            continue
        enc_macs = None if p.encoding_flops is None else p.encoding_flops // 2
        enc_ops = (p.encoding_elementwise or 0) + (p.encoding_gathers or 0)
        ms = "-" if p.time_median_s is None else f"{1e3 * p.time_median_s:.1f}"
        lines.append(
            f"| {r.encoding} | {p.size} | {r.encoding_parameters:,} | {_giga(p.macs)} "
            f"| {_mega(enc_macs)} | {enc_ops / 1e6:.2f} | {_mb(p.peak_bytes)} "
            f"({_ratio(p.memory_ratio)}) | {ms} ({_ratio(p.time_ratio)}) "
            f"| {_exp(r.time_exponent)} | {_exp(r.memory_exponent)} |"
        )
    if not selection:
        return "\n".join(lines)
    lines += [
        "",
        "| encoding | article: compute | time x none | article: long sequences | memory x none "
        "| growth (time / memory) | runs past trained length |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in selection:
        lines.append(
            f"| {row['encoding']} | {row['article_compute']} | {_ratio(row['time_ratio'])} "
            f"| {row['article_long_sequences']} | {_ratio(row['memory_ratio'])} "
            f"| N^{_exp(row['time_exponent'])} / N^{_exp(row['memory_exponent'])} "
            f"| {'yes' if row['extrapolates'] else 'no'} |"
        )
    return "\n".join(lines)

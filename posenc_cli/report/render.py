"""The report as Markdown (for the README), a rich table (for the terminal) and a PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from posenc_cli.encodings import dims_name
from posenc_cli.report.article import FAMILY, ROWS, TABLE


def _num(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _times(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def study_header(report: dict[str, Any], study: dict[str, Any]) -> str:
    multiples = [
        r["studies"][study["name"]]["extrapolation"]["multiple"]
        for r in report["encodings"]
        if study["name"] in r["studies"] and r["studies"][study["name"]]["extrapolation"]
    ]
    at = f"1x → {multiples[0]:g}x" if multiples else "1x → -"
    return f"{study['name']}: {study['metric']} {at}"


def columns(report: dict[str, Any]) -> list[str]:
    studies = [study_header(report, s) for s in report["studies"]]
    first = report["studies"][0]["name"] if report["studies"] else "-"
    return [
        "encoding", "family", *studies, "time x none", "memory x none",
        "growth (time / memory)", f"seed sd at 1x ({first})", "diverged", "code lines",
        "attention", "dims (counterpart)",
    ]  # fmt: skip


def row_cells(report: dict[str, Any], row: dict[str, Any]) -> list[str]:
    cells = [row["encoding"], row["family"]]
    for study in report["studies"]:
        extra = row["studies"].get(study["name"], {}).get("extrapolation")
        cells.append("-" if not extra else f"{extra['at_1x']:.3f} → {extra['at_kx']:.3f}")
    cost = row["cost"] or {}
    cells += [_times(cost.get("time_ratio")), _times(cost.get("memory_ratio"))]
    growth = f"{_num(cost.get('time_exponent'), 2)} / {_num(cost.get('memory_exponent'), 2)}"
    cells.append(growth if cost else "-")
    first = report["studies"][0]["name"] if report["studies"] else None
    sd = row["studies"].get(first, {}).get("stability", {}).get("sd_at_1x")
    cells.append(_num(sd))
    d = row["diverged"]
    cells.append(f"{d['diverged']}/{d['runs']}" if d["runs"] else "-")
    cells += [str(row["implementation"]["lines"]), row["implementation"]["attention"]]
    mine = dims_name(row["multimodal"]["dims"][0])
    other = row["multimodal"]["counterpart"]
    cells.append(f"{mine} ({other})" if other else mine)
    return cells


COLOURS = {"none": "black", "absolute": "tab:orange", "relative": "tab:blue",
           "rope": "tab:green", "alibi": "tab:red", "not in the article": "tab:gray"}  # fmt: skip

NOTES = (
    "extrapolation: the study's metric at 1x (the longest trained length) and at the longest "
    "evaluated length up to 4x; time, memory: ratios to none at the largest profiled size; "
    "growth: log-log slopes over the upper sizes; diverged: runs whose loss became NaN; code "
    "lines: the class and the module functions it calls, without blanks, comments and "
    "docstrings; attention: fused (SDPA runs as is), bias (SDPA with a dense N x N term), "
    "blocked (the bias asked for one block of queries at a time, no N x N tensor; XL and DeBERTa "
    "under a causal mask only) or own (attention of its own); dims: what it serves, and in "
    "brackets the registry's same scheme for the other dimension."
)


def markdown(report: dict[str, Any]) -> str:
    head = columns(report)
    lines = ["### The selection table, measured", ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row_cells(report, r)) + " |" for r in report["encodings"]]
    lines += ["", NOTES, "", "### What the article says (section 4.1)", ""]
    families = list(TABLE)
    lines += ["| | " + " | ".join(families) + " |", "|" + "---|" * (len(families) + 1)]
    for i, row in enumerate(ROWS):
        lines.append(f"| {row} | " + " | ".join(TABLE[f][i] for f in families) + " |")
    lines += ["", "### Its scenario advice, beside the measurements", ""]
    for s in report["scenarios"]:
        measured = s["measured"] or "no study or profile given measures it"
        lines.append(
            f"- **{s['scenario']}**: the article picks {s['article_pick']}. "
            f"Measured: {measured}. Verdict: **{s['verdict']}**."
        )
    return "\n".join(lines) + "\n"


def terminal_tables(report: dict[str, Any]) -> list[Table]:
    table = Table(title="the article's selection table, measured", title_justify="left")
    for col in columns(report):
        table.add_column(col, justify="left" if col in ("encoding", "family") else "right")
    for r in report["encodings"]:
        table.add_row(*row_cells(report, r))
    table.caption = NOTES
    advice = Table(title="its scenario advice, beside the measurements", title_justify="left")
    for col in ("scenario", "article", "verdict", "measured"):
        advice.add_column(col)
    for s in report["scenarios"]:
        advice.add_row(s["scenario"], s["article_pick"], s["verdict"], s["measured"] or "-")
    return [table, advice]


def save_plot(report: dict[str, Any], out: Path) -> Path:
    """Left: cost against extrapolation of the first study that measures it, one point per
    encoding (time ratio from the profile, else code lines). Right: the seed spread at 1x."""
    from posenc_cli.plots import plt, save_figure

    first = next(
        (s for s in report["studies"]
         if any((r["studies"].get(s["name"]) or {}).get("extrapolation")
                for r in report["encodings"])),
        None,
    )  # fmt: skip
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    costs = any(r["cost"] and r["cost"]["time_ratio"] for r in report["encodings"])
    for r in report["encodings"]:
        extra = (r["studies"].get(first["name"]) or {}).get("extrapolation") if first else None
        x = r["cost"]["time_ratio"] if costs and r["cost"] else r["implementation"]["lines"]
        if extra and extra["ratio"] is not None and x:
            other = "none" if r["encoding"] == "none" else "not in the article"
            family = FAMILY.get(r["encoding"], other)
            left.scatter(x, extra["ratio"], s=40, label=family, color=COLOURS[family])
            left.annotate(r["encoding"], (x, extra["ratio"]), textcoords="offset points",
                          xytext=(4, 4), fontsize=8)  # fmt: skip
    left.set_xlabel("time per step, x none (profile)" if costs else "code lines")
    if first:
        left.set_ylabel(f"{first['metric']} at the far length / at 1x ({first['name']})")
    left.set_title("what it costs against how it extrapolates")
    left.axhline(1.0, color="grey", lw=0.8, ls="--")
    handles, labels = left.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    if unique:
        left.legend(unique.values(), unique.keys(), fontsize=8, title="article family")
    name = report["studies"][0]["name"] if report["studies"] else None
    spread = [
        (r["encoding"], r["studies"][name]["stability"]["sd_at_1x"])
        for r in report["encodings"]
        if name in r["studies"] and r["studies"][name]["stability"]["sd_at_1x"] is not None
    ]
    if spread:
        right.bar([n for n, _ in spread], [v for _, v in spread], color="tab:blue")
        right.tick_params(axis="x", rotation=45)
    right.set_title(f"training stability: seed spread at 1x ({name})")
    right.set_ylabel("standard deviation over seeds")
    fig.tight_layout()
    return save_figure(fig, out)

"""Matplotlib figures. Imported lazily by the CLI so that plain commands stay quick."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no screen on CI
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from posenc_cli.bias_maps import BiasMap  # noqa: E402
from posenc_cli.bucket_maps import BucketMap  # noqa: E402
from posenc_cli.runs.checkpoint import atomic_write_bytes  # noqa: E402


def save_bias_maps(maps: list[BiasMap], title: str, out: Path, max_heads: int = 8) -> Path:
    """One row per map kind, one panel per head (at most ``max_heads``)."""
    rows = len(maps)
    cols = min(max(m.maps.shape[0] for m in maps), max_heads)
    fig, axes = plt.subplots(
        rows, cols, figsize=(2.6 * cols + 0.6, 2.6 * rows + 0.8), squeeze=False
    )
    for r, bias_map in enumerate(maps):
        for c in range(cols):
            ax = axes[r][c]
            if c >= bias_map.maps.shape[0]:
                ax.axis("off")
                continue
            image = ax.imshow(bias_map.maps[c].numpy(), cmap="viridis", interpolation="nearest")
            head = f"head {c}" if bias_map.maps.shape[0] > 1 else "all heads"
            ax.set_title(f"{bias_map.title}\n{head}" if c == 0 else head, fontsize=8)
            ax.set_xlabel("key j", fontsize=7)
            ax.set_ylabel("query i", fontsize=7)
            ax.tick_params(labelsize=6)
            fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04).ax.tick_params(labelsize=6)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, out)


def _bucket_colormap(count: int):
    # qualitative colours tell neighbouring buckets apart while there are few of them
    return plt.get_cmap("tab20", count) if count <= 20 else plt.get_cmap("viridis")


def save_bucket_maps(maps: list[BucketMap], title: str, out: Path) -> Path:
    """1D: bucket against relative position above the N x N map. 2D: one grid per map, ids in
    the cells of small grids, the query patch outlined."""
    two_d = maps[0].query is not None
    cols = len(maps)
    rows = 1 if two_d else 2
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols + 0.6, 4.0 * rows), squeeze=False)
    for c, bucket_map in enumerate(maps):
        cmap = _bucket_colormap(bucket_map.count)
        label = f"{bucket_map.title}\n{bucket_map.count} buckets, {bucket_map.used} used here"
        if two_d:
            ax = axes[0][c]
            ids = bucket_map.ids.numpy()
            image = ax.imshow(ids, cmap=cmap, vmin=0, vmax=bucket_map.count - 1)
            if ids.size <= 400:
                for (r, k), value in np.ndenumerate(ids):
                    shade = image.cmap(image.norm(value))
                    dark = 0.299 * shade[0] + 0.587 * shade[1] + 0.114 * shade[2] < 0.5
                    ax.text(
                        k,
                        r,
                        str(value),
                        ha="center",
                        va="center",
                        fontsize=6.5,
                        color="white" if dark else "black",
                    )
            row, col = bucket_map.query
            if bucket_map.mark_query:
                ax.add_patch(Rectangle((col - 0.5, row - 0.5), 1, 1, fill=False, lw=2.2, ec="red"))
                ax.set_title(f"{label}\nquery patch ({row}, {col}) in red", fontsize=8)
            else:
                ax.set_title(f"{label}\nthe query is in another frame", fontsize=8)
            ax.set_xlabel("key column", fontsize=7)
            ax.set_ylabel("key row", fontsize=7)
            fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
            continue
        n = (len(bucket_map.ids) + 1) // 2
        relative = np.arange(-(n - 1), n)
        ax = axes[0][c]
        ax.step(relative, bucket_map.ids.numpy(), where="mid", color="tab:blue")
        ax.set_title(label, fontsize=8)
        ax.set_xlabel("relative position (key - query)", fontsize=7)
        ax.set_ylabel("bucket id", fontsize=7)
        ax.grid(alpha=0.3)
        ax = axes[1][c]
        image = ax.imshow(bucket_map.full.numpy(), cmap=cmap, vmin=0, vmax=bucket_map.count - 1)
        ax.set_xlabel("key j", fontsize=7)
        ax.set_ylabel("query i", fontsize=7)
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, out)


def save_figure(fig, out: Path) -> Path:
    """Render in memory, then write atomically: never a half-written picture under the
    user's name."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out, buffer.getvalue())
    return out


def band(
    means: list[float], half_widths: list[float], limits: tuple[float, float] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The lower and upper edges of ``means ± half_widths``, cut to the values the metric can
    take (``limits``): with 3 seeds a t-based 95% interval of an exact match of 0.5 can span
    -0.8 to 1.9, which the picture should not draw."""
    means_a, half_a = np.asarray(means, dtype=float), np.asarray(half_widths, dtype=float)
    low, high = limits or (-np.inf, np.inf)
    return np.clip(means_a - half_a, low, high), np.clip(means_a + half_a, low, high)


def save_length_curves(
    series: dict[str, tuple[list[int], list[float], list[float]]],
    metric: str,
    title: str,
    out: Path,
    trained: tuple[int, int] | None = None,
    limits: tuple[float, float] | None = None,
) -> Path:
    """Metric against evaluated length, one line per encoding: the mean with a band of the
    given half-widths (compare passes the 95% confidence interval), cut to ``limits``."""
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    for label, (lengths, means, half_widths) in series.items():
        ax.plot(lengths, means, marker="o", label=label)
        ax.fill_between(lengths, *band(means, half_widths, limits), alpha=0.15)
    if trained is not None:
        ax.axvspan(trained[0], trained[1], color="grey", alpha=0.12, label="trained lengths")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("length")
    ax.set_ylabel(metric.replace("_", " "))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, out)


def save_position_curves(by_length: dict[str, list[float]], title: str, out: Path) -> Path:
    """Accuracy at each answer position, one line per length, every answer from position 1;
    a length's last point, its end token, drawn hollow."""
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    for length, accuracy in by_length.items():
        where = np.arange(1, len(accuracy) + 1)
        (line,) = ax.plot(where[:-1], accuracy[:-1], marker=".", label=f"n={length}")
        ax.plot(where[-1:], accuracy[-1:], marker="o", fillstyle="none", color=line.get_color())
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("answer position (hollow: the end token)")
    ax.set_ylabel("accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, out)


def save_loglog(
    series: dict[str, tuple[list[int], list[float]]],
    xlabel: str,
    ylabel: str,
    title: str,
    out: Path,
    slopes: dict[str, float | None] | None = None,
) -> Path:
    """A cost against problem size on log-log axes, one line per encoding, with the fitted
    exponent in the legend and dotted N^1 and N^2 guides through the first point of the first
    line."""
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    colors = plt.cm.tab20(np.linspace(0, 1, max(len(series), 2)))  # distinct past ten lines
    for i, (label, (sizes, values)) in enumerate(series.items()):
        slope = (slopes or {}).get(label)
        tag = f"{label} (N^{slope:.2f})" if slope is not None else label
        marker = "osD^v<>"[i % 7]
        ax.plot(sizes, values, marker=marker, color=colors[i], label=tag)
    first = next((s for s in series.values() if s[0]), None)
    if first is not None:
        x0, y0 = first[0][0], first[1][0]
        xs = np.asarray(sorted({x for s, _ in series.values() for x in s}), dtype=float)
        for power, style in ((1, ":"), (2, "--")):
            ax.plot(xs, y0 * (xs / x0) ** power, style, color="grey", lw=0.8, label=f"N^{power}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=6, loc="upper left", ncol=2)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, out)


def save_rank_chart(result: dict, out: Path) -> Path:
    """Each encoding's rank in each study, one line per encoding, best at the top; the legend
    in the order of the mean rank."""
    studies = [s["name"] for s in result["studies"]]
    fig, ax = plt.subplots(figsize=(max(4.5, 1.6 * len(studies) + 2.5), 5.2))
    colors = plt.cm.tab20(np.linspace(0, 1, max(len(result["order"]), 2)))
    for color, name in zip(colors, result["order"], strict=False):
        row = result["encodings"][name]
        ranks = [row["studies"][s]["rank"] for s in studies]
        ax.plot(studies, ranks, marker="o", color=color, label=f"{name} ({row['mean_rank']:.1f})")
    ax.set_yticks(range(1, len(result["order"]) + 1))
    ax.invert_yaxis()  # rank 1 on top
    ax.set_ylabel("rank in the study (1 best)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), title="mean rank")
    ax.set_title(f"{result['metric'].replace('_', ' ')} past the trained range", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, out)

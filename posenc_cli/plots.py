"""Matplotlib figures. Imported lazily by the CLI so that plain commands stay quick."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no screen on CI
import matplotlib.pyplot as plt  # noqa: E402

from posenc_cli.bias_maps import BiasMap  # noqa: E402


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
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(out)  # never leave a half-written picture under the user's name
    return out

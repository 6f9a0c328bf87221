"""Local window attention against full attention as the image grid grows.

Forward + backward of one attention layer (B=1, H=3, d=64: DeiT-Ti's heads) on s x s patch grids
with a class token. Time is the median of `torch.utils.benchmark`; memory is the peak resident
set size that the step adds, measured in a fresh child process per configuration (peak RSS after
the step minus RSS before it), so one configuration's allocations cannot hide another's. The
exponent is the slope of log(metric) against log(N) between the two largest grids.

    .venv/bin/python benchmarks/window_attention.py [--sizes 16,32,64] [--window 7]
        [--encoding none] [--format json]
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys

import torch
from rich.console import Console
from rich.table import Table
from torch.utils import benchmark

from posenc_cli.encodings import build_encoding
from posenc_cli.encodings.base import grid_positions
from posenc_cli.models.attention import Attention

HEADS, HEAD_DIM = 3, 64


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def one(size: int, window: int | None, encoding: str) -> dict:
    """Measure a single configuration in this process."""
    torch.set_num_threads(2)
    torch.manual_seed(0)
    dim = HEADS * HEAD_DIM
    enc = build_encoding(encoding, dim=dim, heads=HEADS, head_dim=HEAD_DIM)
    att = Attention(dim, HEADS, enc, window=window)
    positions = grid_positions(size, size, prefix=1)
    x = torch.randn(1, len(positions), dim, requires_grad=True)

    def step() -> None:
        att(enc.embed(x, positions), positions=positions).sum().backward()

    before = rss_mb()
    step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    timer = benchmark.Timer("step()", globals={"step": step}, num_threads=2)
    seconds = timer.blocked_autorange(min_run_time=1.0).median
    return {"tokens": len(positions), "seconds": seconds, "memory_mb": max(peak - before, 0.0)}


def measure(sizes: list[int], window: int, encoding: str) -> dict:
    results = {}
    for label, win in (("full", None), (f"window {window}", window)):
        rows = []
        for size in sizes:
            cmd = [sys.executable, __file__, "--one", str(size), "--encoding", encoding]
            if win is not None:
                cmd += ["--window", str(win)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            rows.append({"grid": f"{size}x{size}", **json.loads(out.strip().splitlines()[-1])})
        results[label] = rows
    return results


def exponent(rows: list[dict], key: str) -> float:
    a, b = rows[-2], rows[-1]
    return math.log(b[key] / a[key]) / math.log(b["tokens"] / a["tokens"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16,32,64")
    parser.add_argument("--window", type=int, default=7)
    parser.add_argument("--encoding", default="none")
    parser.add_argument("--format", choices=["table", "json"], default="table")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        window = args.window if "--window" in sys.argv else None
        print(json.dumps(one(args.one, window, args.encoding)))
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    results = measure(sizes, args.window, args.encoding)
    labels = list(results)
    fits = {
        k: {m: exponent(rows, m) for m in ("seconds", "memory_mb")} for k, rows in results.items()
    }
    if args.format == "json":
        print(json.dumps({"setup": vars(args), "results": results, "exponents": fits}, indent=2))
        return
    table = Table(
        title=f"{args.encoding}: full vs window {args.window} attention, fwd+bwd, "
        f"B=1 H={HEADS} d={HEAD_DIM}, CPU 2 threads"
    )
    for col in (
        "grid",
        "tokens",
        *(f"{k} ms" for k in labels),
        *(f"{k} MB" for k in labels),
        "time full/window",
    ):
        table.add_column(col, justify="right")
    for i, size in enumerate(sizes):
        full, win = results[labels[0]][i], results[labels[1]][i]
        table.add_row(
            f"{size}x{size}",
            str(full["tokens"]),
            f"{full['seconds'] * 1e3:.1f}",
            f"{win['seconds'] * 1e3:.1f}",
            f"{full['memory_mb']:.0f}",
            f"{win['memory_mb']:.0f}",
            f"{full['seconds'] / win['seconds']:.1f}x",
        )
    Console().print(table)
    for label, fit in fits.items():
        Console().print(
            f"{label}: time ~ N^{fit['seconds']:.2f}, memory ~ N^{fit['memory_mb']:.2f}"
        )


if __name__ == "__main__":
    main()

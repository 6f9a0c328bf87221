"""Forward + backward time of one DeiT-Ti attention layer with iRPE, as a ratio to no iRPE.

DeiT-Ti shape: batch 8, 197 tokens (a class token and a 14 x 14 grid), 3 heads of 64, CPU with
2 threads. Ratios are measured in one run, the variants interleaved round by round so that a
noisy machine slows all of them alike; each number is the median over rounds of
``blocked_autorange`` medians. Nothing here is asserted; the README quotes what this prints.

    .venv/bin/python benchmarks/irpe_overhead.py [--rounds 5] [--seconds 1] [--format json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable

import torch
from rich.console import Console
from rich.table import Table
from torch.utils import benchmark

from posenc_cli.encodings.base import PositionEncoding, grid_positions
from posenc_cli.encodings.irpe import ImageRPE
from posenc_cli.models.attention import Attention

# name -> iRPE parameters (None: no iRPE at all), and the target ratio where there is one
VARIANTS: dict[str, dict | None] = {
    "none": None,
    "bias product k": {"mode": "bias", "method": "product", "on": "k"},
    "contextual product k": {"method": "product", "on": "k"},
    "contextual product qk": {"method": "product", "on": "qk"},
    "contextual product qkv": {"method": "product", "on": "qkv"},
    "contextual euclidean k": {"method": "euclidean", "on": "k"},
    "contextual cross k": {"method": "cross", "on": "k"},
}
TARGETS = {
    "bias product k": 1.2,
    "contextual product k": 1.4,
    "contextual product qk": 1.4,
    "contextual product qkv": 1.8,
}


def layer_step(
    params: dict | None, batch: int, heads: int, head_dim: int, side: int
) -> Callable[[], None]:
    torch.manual_seed(0)
    dim = heads * head_dim
    enc: PositionEncoding | None = None
    if params is not None:
        enc = ImageRPE(heads=heads, head_dim=head_dim, **params)
    att = Attention(dim, heads, enc)
    positions = grid_positions(side, side, prefix=1)
    x = torch.randn(batch, len(positions), dim, requires_grad=True)

    def step() -> None:
        att(x, positions=positions).sum().backward()

    return step


def measure(names, batch, heads, head_dim, side, rounds, seconds) -> dict[str, dict[str, float]]:
    steps = {n: layer_step(VARIANTS[n], batch, heads, head_dim, side) for n in names}
    for step in steps.values():
        step()  # warm-up (also fills the id caches, as in training)
    times: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(rounds):
        for n, step in steps.items():
            timer = benchmark.Timer("step()", globals={"step": step}, num_threads=2)
            times[n].append(timer.blocked_autorange(min_run_time=seconds).median)
    base = statistics.median(times["none"])
    return {
        n: {"seconds": statistics.median(t), "ratio": statistics.median(t) / base}
        for n, t in times.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=3)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--side", type=int, default=14, help="grid side (224 px / 16)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0, help="per measurement")
    parser.add_argument("--format", choices=["table", "json"], default="table")
    args = parser.parse_args()
    torch.set_num_threads(2)
    names = list(VARIANTS)
    results = measure(
        names, args.batch, args.heads, args.head_dim, args.side, args.rounds, args.seconds
    )
    if args.format == "json":
        print(json.dumps({"setup": vars(args), "results": results}, indent=2))
        return
    tokens = args.side**2 + 1
    table = Table(
        title=f"iRPE attention layer fwd+bwd, B={args.batch} N={tokens} H={args.heads} "
        f"d={args.head_dim}, CPU 2 threads: time / time(none)"
    )
    for column in ("variant", "ms", "ratio", "target"):
        table.add_column(column, justify="left" if column == "variant" else "right")
    for n in names:
        target = f"<= {TARGETS[n]}x" if n in TARGETS else ""
        r = results[n]
        table.add_row(n, f"{r['seconds'] * 1e3:.1f}", f"{r['ratio']:.2f}x", target)
    Console().print(table)


if __name__ == "__main__":
    main()

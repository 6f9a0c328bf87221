"""Forward + backward time of one attention layer with each encoding, as a ratio to `none`.

Ratios are measured in one run, encodings interleaved round by round, so that a noisy machine
slows all of them alike: each is the median over the rounds of the ratio within a round, shown
with the lowest and highest. Nothing here is asserted; the README quotes what this prints.

    .venv/bin/python benchmarks/attention_overhead.py [--lengths 256,1024] [--format json]
"""

from __future__ import annotations

import argparse
import json

import torch
from interleaved import per_round, ratios_per_round, spread  # benchmarks/, beside it
from rich.console import Console
from rich.table import Table

from posenc_cli.encodings import ENCODINGS, build_encoding
from posenc_cli.models.attention import Attention

TARGETS = {"alibi": 1.3, "t5": 1.3, "shaw": 2.0, "rope": 1.2}


def layer_step(name: str, batch: int, heads: int, head_dim: int, length: int, causal: bool):
    torch.manual_seed(0)
    dim = heads * head_dim
    extra = {"length": length} if name == "learned" else {}
    enc = build_encoding(name, dim=dim, heads=heads, head_dim=head_dim, causal=causal, **extra)
    att = Attention(dim, heads, enc, causal=causal)
    x = torch.randn(batch, length, dim, requires_grad=True)
    positions = torch.arange(length)

    def step() -> None:
        att(enc.embed(x, positions)).sum().backward()

    return step


def measure(names, lengths, batch, heads, head_dim, rounds, seconds, causal):
    results = {}
    for length in lengths:
        steps = {n: layer_step(n, batch, heads, head_dim, length, causal) for n in names}
        results[length] = ratios_per_round(per_round(steps, rounds, seconds))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="256,1024")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.0, help="per measurement")
    parser.add_argument("--causal", action="store_true", help="causal self-attention")
    parser.add_argument("--encodings", default="", help="comma-separated; default every 1D one")
    parser.add_argument("--format", choices=["table", "json"], default="table")
    args = parser.parse_args()
    torch.set_num_threads(2)
    lengths = [int(n) for n in args.lengths.split(",")]
    names = [
        n for n in ENCODINGS
        if ENCODINGS[n].dims == 1 and (args.causal or not ENCODINGS[n].causal_only)
    ]  # fmt: skip
    if args.encodings:
        names = ["none", *(n for n in args.encodings.split(",") if n != "none")]
    results = measure(
        names, lengths, args.batch, args.heads, args.head_dim, args.rounds, args.seconds,
        args.causal,
    )  # fmt: skip
    if args.format == "json":
        print(json.dumps({"setup": vars(args), "results": results}, indent=2))
        return
    table = Table(
        title=f"{'causal ' if args.causal else ''}attention layer fwd+bwd, B={args.batch} "
        f"H={args.heads} d={args.head_dim}, CPU 2 threads: time / time(none)"
    )
    table.add_column("encoding")
    for length in lengths:
        table.add_column(f"N={length}", justify="right")
    table.add_column("target")
    for n in names:
        cells = [spread(results[length][n]) for length in lengths]
        target = f"<= {TARGETS[n]}x" if n in TARGETS else ""
        table.add_row(n, *cells, target)
    base = ", ".join(f"N={n}: {results[n]['none']['seconds'] * 1e3:.1f} ms" for n in lengths)
    Console().print(table)
    Console().print(f"none takes {base}")


if __name__ == "__main__":
    main()

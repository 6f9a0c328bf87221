"""Every 1D encoding against `none` on CUDA: one causal attention layer, fwd+bwd, bf16.

Content-free biases run through FlexAttention (`kernels/flex.py`), compiled once per shape
before timing; the rest take SDPA's CUDA kernels. Ratios are medians of per-round ratios over
interleaved rounds, as in the CPU benchmarks. Without a GPU it says so and exits with status 2.

    .venv/bin/python benchmarks/gpu.py [--lengths 1024,4096,16384] [--format json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from rich.console import Console
from rich.table import Table

from posenc_cli.encodings import ENCODINGS, build_encoding
from posenc_cli.models.attention import Attention


def layer_step(name: str, batch: int, heads: int, head_dim: int, length: int, device: str = "cuda"):
    torch.manual_seed(0)
    dim = heads * head_dim
    extra = {"length": length} if name == "learned" else {}
    enc = build_encoding(name, dim=dim, heads=heads, head_dim=head_dim, causal=True, **extra)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    att = Attention(dim, heads, enc, causal=True).to(device, dtype)
    x = torch.randn(batch, length, dim, device=device, dtype=dtype, requires_grad=True)
    positions = torch.arange(length, device=device)

    def step() -> None:
        att(enc.embed(x, positions)).float().sum().backward()

    return step


def seconds_of(step, repeats: int, device: str = "cuda") -> float:
    if device != "cuda":  # the CPU: only for checking this script without a GPU
        start = time.perf_counter()
        for _ in range(repeats):
            step()
        return (time.perf_counter() - start) / repeats
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / repeats


def per_round_ratio(times: list[float], base: list[float] | None) -> float | None:
    """The median over rounds of each round's time over ``none``'s in that round: a clock that
    drifts between rounds moves both sides of each ratio alike."""
    if base is None:
        return None
    return statistics.median(t / b for t, b in zip(times, base, strict=True))


def measure(names, lengths, batch, heads, head_dim, rounds, repeats, device="cuda"):
    results = {}
    cuda = device == "cuda"
    for length in lengths:
        scaled = max(1, batch * 1024 // length)  # fewer sequences at long lengths: same tokens
        steps, failed = {}, {}
        for n in names:
            try:
                steps[n] = layer_step(n, scaled, heads, head_dim, length, device)
                steps[n]()  # compiles and warms up
                if cuda:
                    torch.cuda.synchronize()
            except Exception as error:  # noqa: BLE001 (a failed compile too): recorded, not hidden
                failed[n] = str(error).splitlines()[0][:120]
                steps.pop(n, None)
            if cuda:
                torch.cuda.empty_cache()
        times = {n: [] for n in steps}
        for _ in range(rounds):
            for n, step in steps.items():
                times[n].append(seconds_of(step, repeats, device))
        base = times.get("none")  # it may fail too
        row = {n: {"seconds": statistics.median(t), "ratio": per_round_ratio(t, base)}
               for n, t in times.items()}  # fmt: skip
        row.update({n: {"failed": why} for n, why in failed.items()})
        results[length] = {"batch": scaled, "encodings": row}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="1024,4096,16384")
    parser.add_argument("--batch", type=int, default=4, help="sequences at 1024 tokens")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--format", choices=["table", "json"], default="table")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("error: benchmarks/gpu.py needs a CUDA GPU; none is visible here", file=sys.stderr)
        sys.exit(2)
    lengths = [int(n) for n in args.lengths.split(",")]
    names = [n for n in ENCODINGS if ENCODINGS[n].dims == 1]
    results = measure(
        names, lengths, args.batch, args.heads, args.head_dim, args.rounds, args.repeats
    )
    device = torch.cuda.get_device_name()
    if args.format == "json":
        print(json.dumps({"setup": vars(args), "device": device, "results": results}, indent=2))
        return
    Console().print(ratio_table(results, names, lengths, device))


def ratio_table(results, names, lengths, device: str) -> Table:
    table = Table(title=f"causal attention fwd+bwd, bf16, {device}: time / time(none)")
    table.add_column("encoding")
    for length in lengths:
        table.add_column(f"N={length} (B={results[length]['batch']})", justify="right")
    for n in names:
        cells = []
        for length in lengths:
            cell = results[length]["encodings"][n]
            if "failed" in cell:
                cells.append("failed")
            elif cell["ratio"] is None:  # none failed at this length
                cells.append(f"{cell['seconds'] * 1e3:.1f} ms")
            else:
                cells.append(f"{cell['ratio']:.2f}x")
        table.add_row(n, *cells)
    return table


if __name__ == "__main__":
    main()

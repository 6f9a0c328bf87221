"""Forward + backward time of one DeiT-Ti attention layer with iRPE, as a ratio to no iRPE.

DeiT-Ti shape: batch 8, 197 tokens (a class token and a 14 x 14 grid), 3 heads of 64, CPU with
2 threads. Ratios are measured in one run, the variants interleaved round by round so that a
noisy machine slows all of them alike; each ratio is the median of the ratios within each round,
with the lowest and highest round beside it. Nothing here is asserted; the README quotes what
this prints.

``--explicit`` adds, for every iRPE variant, the same layer forced onto the attention module's
explicit softmax path (the path it takes for value terms). Without a value term the module picks
that path by itself below ``EXPLICIT_MAX_PAIRS`` (so at the default size the two rows agree) and
above it sends the learned bias through ``biased_attention`` (flash forward, bias gradient
recomputed in the backward); with ``--side`` the rows show where the crossover lies.
``--wait-idle S`` waits (up to S seconds, Linux only) before each measurement until no other
process keeps the CPUs busy: on a shared 2-core machine one foreign process can slow a 2-thread
measurement tenfold, and not evenly across variants.

    .venv/bin/python benchmarks/irpe_overhead.py [--rounds 5] [--seconds 1] [--explicit]
        [--wait-idle 120] [--format json]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
from interleaved import per_round, ratios_per_round, spread  # benchmarks/, beside it
from rich.console import Console
from rich.table import Table

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


class ExplicitPathRPE(ImageRPE):
    """Measurement device only: reporting a value term sends attention down its explicit
    softmax path; ``value`` still returns None when ``on`` has no v, so the output is equal."""

    @property
    def uses_value(self) -> bool:
        return True


def cpu_busy(seconds: float = 0.5) -> float:
    """Fraction of all CPUs busy over ``seconds`` (Linux ``/proc/stat``; 0 elsewhere). Niced work
    counts as busy: measured here, it still slows 2-thread kernels several times."""
    stat = Path("/proc/stat")
    if not stat.exists():
        return 0.0

    def sample() -> tuple[int, int]:
        fields = [int(v) for v in stat.read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields) - idle, idle

    busy0, idle0 = sample()
    time.sleep(seconds)
    busy1, idle1 = sample()
    return (busy1 - busy0) / max(1, busy1 - busy0 + idle1 - idle0)


def wait_idle(limit: float) -> None:
    """Return once the machine was < 8% busy for 1.5 s, or after ``limit`` seconds."""
    end, quiet = time.monotonic() + limit, 0
    while time.monotonic() < end and quiet < 3:
        quiet = quiet + 1 if cpu_busy() < 0.08 else 0


def layer_step(
    params: dict | None, batch: int, heads: int, head_dim: int, side: int, explicit: bool = False
) -> Callable[[], None]:
    torch.manual_seed(0)
    dim = heads * head_dim
    enc: PositionEncoding | None = None
    if params is not None:
        cls = ExplicitPathRPE if explicit else ImageRPE
        enc = cls(heads=heads, head_dim=head_dim, **params)
    att = Attention(dim, heads, enc)
    positions = grid_positions(side, side, prefix=1)
    x = torch.randn(batch, len(positions), dim, requires_grad=True)

    def step() -> None:
        att(x, positions=positions).sum().backward()

    return step


EXPLICIT = " (explicit path)"


def measure(
    names, batch, heads, head_dim, side, rounds, seconds, explicit, idle
) -> dict[str, dict[str, float]]:
    steps = {n: layer_step(VARIANTS[n], batch, heads, head_dim, side) for n in names}
    for n in names if explicit else []:
        if VARIANTS[n] is not None:
            steps[n + EXPLICIT] = layer_step(VARIANTS[n], batch, heads, head_dim, side, True)
    wait = (lambda: wait_idle(idle)) if idle > 0 else None
    return ratios_per_round(per_round(steps, rounds, seconds, before_each=wait))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=3)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--side", type=int, default=14, help="grid side (224 px / 16)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0, help="per measurement")
    parser.add_argument("--explicit", action="store_true", help="also on the explicit path")
    parser.add_argument("--wait-idle", type=float, default=0.0, metavar="S")
    parser.add_argument("--format", choices=["table", "json"], default="table")
    args = parser.parse_args()
    torch.set_num_threads(2)
    results = measure(
        list(VARIANTS),
        args.batch,
        args.heads,
        args.head_dim,
        args.side,
        args.rounds,
        args.seconds,
        args.explicit,
        args.wait_idle,
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
    for n in results:
        target = f"<= {TARGETS[n]}x" if n in TARGETS else ""
        r = results[n]
        table.add_row(n, f"{r['seconds'] * 1e3:.1f}", spread(r), target)
    Console().print(table)


if __name__ == "__main__":
    main()

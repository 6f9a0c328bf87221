"""posenc beside x-transformers: one pre-norm attention layer, fwd+bwd, the same shapes.

For every encoding both libraries have, each library's layer is timed against its own layer
without position information, and the two are timed against each other. Rounds interleave all
layers so a noisy machine slows them alike, and each ratio is the median over the rounds of the
ratio within a round. Nothing is asserted; the README quotes what this
prints. Needs the bench extra (`make bench-install`: x-transformers without its torch pin).

    .venv/bin/python benchmarks/peers.py [--lengths 256,1024] [--format json]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
from interleaved import per_round, round_ratios  # benchmarks/interleaved.py, beside it
from rich.console import Console
from rich.table import Table
from torch import nn

from posenc_cli.encodings import build_encoding
from posenc_cli.models.attention import Attention

# posenc's name -> x-transformers' AttentionLayers keywords for the same encoding, with its
# settings brought to posenc's defaults (rotary on the whole head, CoPE's 64 positions); both
# run on SDPA's flash kernel where x-transformers allows it (not for T5 or CoPE)
PEERS: dict[str, dict] = {
    "none": {},
    "alibi": {"alibi_pos_bias": True},
    "t5": {"rel_pos_bias": True, "attn_flash": False},
    "rope": {"rotary_pos_emb": True, "rotary_emb_dim": None},
    "xpos": {"rotary_xpos": True, "rotary_emb_dim": None},
    "cope": {"attn_use_cope": True, "attn_cope_max_pos": 64, "attn_flash": False},
    "fox": {"attn_data_dependent_alibi": True},  # the Forgetting Transformer's gate
    "pope": {"polar_pos_emb": True},
}
CAUSAL_ONLY = {"xpos", "cope", "fox"}


class PosencLayer(nn.Module):
    """The shape of an x-transformers attention-only layer: pre-norm, residual, final norm."""

    def __init__(self, name: str, dim: int, heads: int, causal: bool) -> None:
        super().__init__()
        encoding = build_encoding(name, dim=dim, heads=heads, head_dim=dim // heads, causal=causal)
        self.norm, self.final = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attention = Attention(dim, heads, encoding, causal=causal, qkv_bias=False)

    def forward(self, x):
        return self.final(x + self.attention(self.norm(x)))


def peer_layer(name: str, dim: int, heads: int, causal: bool) -> nn.Module:
    from x_transformers import Decoder, Encoder

    keywords = {"attn_flash": True, **PEERS[name]}
    if "rotary_emb_dim" in keywords:
        keywords["rotary_emb_dim"] = dim // heads
    kind = Decoder if causal else Encoder
    return kind(
        dim=dim, heads=heads, attn_dim_head=dim // heads, custom_layers=("a",), **keywords,
    )  # fmt: skip


def step_of(layer: nn.Module, x: torch.Tensor):
    def step() -> None:
        layer(x).sum().backward()

    return step


def ratio(times, top, bottom) -> float:
    """The median over the rounds of ``top``'s time over ``bottom``'s within a round."""
    return statistics.median(round_ratios(times[top], times[bottom]))


def measure(lengths, batch, heads, head_dim, causal, rounds, seconds):
    dim = heads * head_dim
    names = [n for n in PEERS if causal or n not in CAUSAL_ONLY]
    results = {}
    for length in lengths:
        torch.manual_seed(0)
        x = torch.randn(batch, length, dim, requires_grad=True)
        steps = {}
        for n in names:
            steps[("posenc", n)] = step_of(PosencLayer(n, dim, heads, causal), x)
            steps[("x-transformers", n)] = step_of(peer_layer(n, dim, heads, causal), x)
        times = per_round(steps, rounds, seconds)
        results[length] = {
            n: {
                "posenc_seconds": statistics.median(times[("posenc", n)]),
                "peer_seconds": statistics.median(times[("x-transformers", n)]),
                "posenc_vs_own_none": ratio(times, ("posenc", n), ("posenc", "none")),
                "peer_vs_own_none": ratio(times, ("x-transformers", n), ("x-transformers", "none")),
                "posenc_over_peer": ratio(times, ("posenc", n), ("x-transformers", n)),
            }
            for n in names
        }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="256,1024")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=0.5, help="per measurement")
    parser.add_argument("--format", choices=["table", "json"], default="table")
    args = parser.parse_args()
    torch.set_num_threads(2)
    lengths = [int(n) for n in args.lengths.split(",")]
    measured = {}
    for causal in (True, False):
        measured["causal" if causal else "bidirectional"] = measure(
            lengths, args.batch, args.heads, args.head_dim, causal, args.rounds, args.seconds
        )
    if args.format == "json":
        print(json.dumps({"setup": vars(args), "results": measured}, indent=2))
        return
    for kind, results in measured.items():
        table = Table(
            title=f"{kind} attention layer fwd+bwd, B={args.batch} H={args.heads} "
            f"d={args.head_dim}, CPU 2 threads"
        )
        table.add_column("encoding")
        for length in lengths:
            table.add_column(f"posenc / none N={length}", justify="right")
            table.add_column(f"x-tf / none N={length}", justify="right")
            table.add_column(f"posenc / x-tf N={length}", justify="right")
        for n in results[lengths[0]]:
            cells = []
            for length in lengths:
                r = results[length][n]
                cells += [
                    f"{r['posenc_vs_own_none']:.2f}x",
                    f"{r['peer_vs_own_none']:.2f}x",
                    f"{r['posenc_over_peer']:.2f}",
                ]
            table.add_row(n, *cells)
        Console().print(table)


if __name__ == "__main__":
    main()

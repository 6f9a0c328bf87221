"""DETR's "sine + iRPE" encoder attention, forward + backward, with and without iRPE's own kernel.

``SineQK`` used to forward each hook by hand and had no ``attend``, so the wrapped iRPE never ran
its contextual kernel (``kernels/bucket_attention.py``); ``WrappedEncoding`` now forwards every
hook. This times one encoder attention layer at the shapes recipe's and at DETR-R50's grid both
ways, interleaved round by round, and prints the ratio. Nothing is asserted.

    .venv/bin/python benchmarks/sine_irpe.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics

import torch
from torch.utils import benchmark

from posenc_cli.encodings import build_encoding
from posenc_cli.encodings.base import PositionEncoding, grid_positions
from posenc_cli.encodings.sincos2d import SinCos2D
from posenc_cli.models.attention import Attention
from posenc_cli.tasks.detection.detr import SineQK

ON_SETTINGS = ("k", "qk", "qkv")  # where iRPE adds its contextual term
SHAPES = {
    "shapes recipe (8 x 8, dim 64)": (8, 8, 64, 4, 8),
    "DETR-R50 (25 x 34, 256)": (25, 34, 256, 8, 2),
}


class WithoutAttend(SineQK):
    """The old wrapper: every hook but ``attend`` reached iRPE."""

    def attend(self, *args, **kwargs):
        return PositionEncoding.attend(self, *args, **kwargs)


def layer(wrapper: type, on: str, height: int, width: int, dim: int, heads: int) -> Attention:
    torch.manual_seed(0)
    irpe = build_encoding("irpe", heads=heads, head_dim=dim // heads, on=on)
    return Attention(dim, heads, wrapper(SinCos2D(dim=dim, where="qk"), irpe))


def step_time(attention: Attention, x: torch.Tensor, positions: torch.Tensor) -> float:
    def step() -> None:
        attention(x, positions=positions).sum().backward()

    return (
        benchmark.Timer("step()", globals={"step": step}).blocked_autorange(min_run_time=0.5).median
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(2)
    for name, (height, width, dim, heads, batch) in SHAPES.items():
        x = torch.randn(batch, height * width, dim)
        positions = grid_positions(height, width)
        for on in ON_SETTINGS:
            new = layer(SineQK, on, height, width, dim, heads)
            old = layer(WithoutAttend, on, height, width, dim, heads)
            times = {"attend": [], "no attend": []}
            for _ in range(args.rounds):  # interleaved: outside load slows both alike
                times["attend"].append(step_time(new, x, positions))
                times["no attend"].append(step_time(old, x, positions))
            fast, slow = (statistics.median(times[k]) for k in ("attend", "no attend"))
            print(
                f"{name}, iRPE on {on}: {slow * 1e3:.2f} ms -> {fast * 1e3:.2f} ms per step "
                f"({fast / slow:.2f}x)"
            )


if __name__ == "__main__":
    main()

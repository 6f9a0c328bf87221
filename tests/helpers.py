"""Small builders shared by the tests: one encoding plus the one attention module, the CLI."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from posenc_cli.cli import main
from posenc_cli.encodings import ENCODINGS, build_encoding
from posenc_cli.models.attention import Attention

DIM, HEADS = 32, 4

# A text run of a few seconds on top of any text recipe: one block of width 32, 6 steps
TINY_TEXT = [
    "model.dim=32",
    "model.depth=1",
    "train.steps=6",
    "train.batch_size=8",
    "train.eval_every=3",
    "train.checkpoint_every=3",
    "train.eval_batches=2",
    "train.warmup=2",
    "eval.lengths=[4,8]",
    "eval.batches=2",
]


def run(capsys, *args: str) -> tuple[int, str, str]:
    """``posenc ARGS`` in-process: (exit status, stdout, stderr)."""
    with pytest.raises(SystemExit) as done:
        main(list(args))
    out, err = capsys.readouterr()
    return done.value.code or 0, out, err


class Layer(nn.Module):
    """Input embedding (for absolute encodings) followed by one attention layer."""

    def __init__(self, name: str, causal: bool = False, **params) -> None:
        super().__init__()
        causal = causal or ENCODINGS[name].causal_only  # xPos exists only in causal form
        self.encoding = build_encoding(
            name, dim=DIM, heads=HEADS, head_dim=DIM // HEADS, causal=causal, **params
        )
        self.attention = Attention(DIM, HEADS, self.encoding, causal=causal)

    def forward(self, x: Tensor, offset: int = 0, memory=None, key_mask=None) -> Tensor:
        n_mem = 0 if memory is None else memory.shape[1]
        positions = torch.arange(offset + n_mem, offset + n_mem + x.shape[1])
        x = self.encoding.embed(x, positions)
        return self.attention(x, memory=memory, key_mask=key_mask, offset=offset)


def layer(name: str, causal: bool = False, seed: int = 0, **params) -> Layer:
    torch.manual_seed(seed)
    module = Layer(name, causal=causal, **params).double()
    for p in module.parameters():  # zero-initialised tables would make tests vacuous
        if p.abs().max() == 0:
            nn.init.normal_(p, std=0.5)
    return module


def torchrun_available() -> bool:
    import shutil
    import sys
    from pathlib import Path

    return shutil.which("torchrun", path=str(Path(sys.executable).parent)) is not None


def free_port() -> int:
    """A TCP port nothing listens on now: fixed ports collide when two test runs overlap."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_torchrun(args: list[str], processes: int = 2):
    """``torchrun -m posenc_cli ARGS`` with one thread per process; returns the finished process."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    command = [
        str(Path(sys.executable).parent / "torchrun"),
        f"--nproc_per_node={processes}",
        f"--master_port={free_port()}",
        "-m",
        "posenc_cli",
        *args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=240)


def ddp_train(args: list[str], out) -> dict:
    """``posenc train ARGS --out OUT`` in 2 processes on the CPU; asserts it exits 0 and returns
    the run's summary.json."""
    import json

    proc = run_torchrun(["train", *args, "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads((out / "summary.json").read_text())

"""What every task's training does first, spelled once: the console, the device, the process
group under torchrun, and on rank 0 the run directory (made, or refused without ``--resume``)
with its ``recipe.yaml``."""

from __future__ import annotations

from pathlib import Path

import torch
from rich.console import Console

from posenc_cli.config import Recipe, write_recipe
from posenc_cli.runs import distributed
from posenc_cli.runs.device import pick_device
from posenc_cli.runs.directory import prepare_directory
from posenc_cli.runs.distributed import World


def start_run(
    recipe: Recipe, out: Path, resume: bool, console: Console | None
) -> tuple[Console, torch.device, World]:
    console = console or Console(stderr=True)
    device = pick_device(recipe.train.device)
    world = distributed.start(device)
    if world.main:
        prepare_directory(out, resume)
        write_recipe(out, recipe)
    return console, device, world

"""Where a run computes: the device a recipe or flag asks for, and its autocast."""

from __future__ import annotations

import os
from contextlib import nullcontext

import torch

from posenc_cli.errors import UsageError


def pick_device(choice: str, option: str = "train.device") -> torch.device:
    """``option`` is what the user set (a recipe key or a flag), named if cuda is missing."""
    if choice == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"{option}: cuda was asked for but no GPU is visible; use auto or cpu")
    if choice == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    if "LOCAL_RANK" in os.environ:  # under torchrun: one GPU per process
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    return torch.device("cuda", torch.cuda.current_device())


def autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()


def seed_device(seed: int, device: torch.device) -> None:
    """``torch.manual_seed`` for the generator ``device`` draws from. On a CPU run it skips
    the accelerator modules, whose lazy seeding formats a stack trace every call: a few
    percent of a small model's step when it is done every step."""
    torch.random.default_generator.manual_seed(seed)
    if device.type == "cuda":
        torch.cuda.manual_seed_all(seed)

"""Just enough of torch.distributed for ``torchrun --nproc_per_node=N posenc train ...``.

Ranks come from the environment torchrun sets; gloo on the CPU, nccl on CUDA. Only rank 0
writes files; the others train their share of each batch and wait at barriers.

A process makes one process group and keeps it for every run of a sweep: destroying it and
making another under torchrun reuses the launcher's store keys, and the second run's ranks then
wait for each other forever. Every collective is bounded by a timeout (``POSENC_DIST_TIMEOUT``
seconds, 30 minutes by default), so a rank that dies or hangs makes the others stop with a
clear message instead of waiting without end.
"""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from posenc_cli.errors import UsageError

TIMEOUT_VARIABLE = "POSENC_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 1800


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier()

    def broadcast_flag(self, flag: bool) -> bool:
        """Rank 0's decision for everyone (a stop, say), so no rank waits forever."""
        if self.size == 1:
            return flag
        t = torch.tensor([int(flag)], device=collective_device())
        dist.broadcast(t, src=0)
        return bool(t.item())


def collective_device() -> torch.device:
    """Where a tensor for a collective must live: NCCL takes CUDA tensors only, gloo CPU ones."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class PeerLost(RuntimeError):
    """Another process of the world failed, hung or went away; the message says what to do."""


def is_main_process() -> bool:
    """Rank 0, or the only process; readable before the process group exists."""
    return int(os.environ.get("RANK", "0")) == 0


def timeout_seconds() -> float:
    text = os.environ.get(TIMEOUT_VARIABLE, "")
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < 1e7:
        raise UsageError(
            f"{TIMEOUT_VARIABLE}={text!r}: give the seconds a rank may wait for the others, "
            f"e.g. {DEFAULT_TIMEOUT_S}"
        )
    return seconds


def start(device: torch.device) -> World:
    """The world of this process; the process group is made on the first call and kept."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        return World()
    if not dist.is_initialized():
        dist.init_process_group(
            backend="nccl" if device.type == "cuda" else "gloo",
            timeout=timedelta(seconds=timeout_seconds()),
        )
        atexit.register(stop)
    return World(dist.get_rank(), dist.get_world_size())


def stop() -> None:
    """End the process group (at exit; a sweep's runs share one group)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def peer_failure(err: BaseException, world: World) -> bool:
    """Whether ``err`` is a collective that failed because another process did: torch raises a
    DistError for some and a plain RuntimeError from gloo or NCCL (a timeout, a closed
    connection) for others."""
    if world.size == 1 or not isinstance(err, RuntimeError):
        return False
    marks = ("gloo", "NCCL", "Connection closed by peer", "Connection reset by peer")
    return isinstance(err, dist.DistError) or any(mark in str(err) for mark in marks)


def lost(err: BaseException, world: World, out: object) -> PeerLost:
    """A failed collective as one line: which rank saw it, what is kept, how to go on."""
    reason = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
    if len(reason) > 160:
        reason = reason[:157] + "..."
    return PeerLost(
        f"rank {world.rank} of {world.size} lost the other processes ({reason}); the last "
        f"checkpoint in {out} is kept; rerun the same command with --resume (a rank waits "
        f"{timeout_seconds():g} s for the others, set by {TIMEOUT_VARIABLE})"
    )

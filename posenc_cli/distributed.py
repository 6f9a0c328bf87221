"""Just enough of torch.distributed for ``torchrun --nproc_per_node=N posenc train ...``.

Ranks come from the environment torchrun sets; gloo on the CPU, nccl on CUDA. Only rank 0
writes files; the others train their share of each batch and wait at barriers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


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
        t = torch.tensor([int(flag)])
        dist.broadcast(t, src=0)
        return bool(t.item())


def is_main_process() -> bool:
    """Rank 0, or the only process; readable before the process group exists."""
    return int(os.environ.get("RANK", "0")) == 0


def start(device: torch.device) -> World:
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        return World()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return World(dist.get_rank(), dist.get_world_size())


def stop(world: World) -> None:
    if world.size > 1 and dist.is_initialized():
        dist.destroy_process_group()

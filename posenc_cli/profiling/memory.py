"""Peak memory of one step, the same quantity on CUDA and on the CPU.

The figure is the peak of tensor memory allocated *during* the step, above what was alive
before it (parameters, inputs): activations, saved tensors, temporaries and gradients.

- CUDA: the caching allocator's statistics, ``max_memory_allocated() - memory_allocated()``
  after ``reset_peak_memory_stats()``.
- CPU: the CPU allocator keeps no statistics and the profiler's memory events are not recorded
  in every build, so a dispatch mode tracks every storage an operator returns, adds its size
  when it appears and subtracts it when the storage is freed (a weak reference callback), and
  keeps the maximum. Like the CUDA figure, it counts what tensors hold, not allocator slack or
  freed pages the process keeps; views are not double-counted.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveTensorBytes(TorchDispatchMode):
    """Bytes of the storages created inside the mode that are still alive, and their peak.

    With ``record`` it also keeps ``trace``, the live bytes after every new storage: a peak
    always follows an allocation, so the trace holds every candidate for it (``budget.py``
    extrapolates each one to larger sizes).
    """

    def __init__(self, device_type: str = "cpu", record: bool = False) -> None:
        super().__init__()
        self.device_type = device_type
        self.live = 0
        self.peak = 0
        self.trace: list[int] | None = [] if record else None
        self._sizes: dict[int, int] = {}

    def _track(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata  # the C++ storage: shared by every view of it
        if key in self._sizes:
            return
        size = storage.nbytes()
        self._sizes[key] = size
        self.live += size
        self.peak = max(self.peak, self.live)
        if self.trace is not None:
            self.trace.append(self.live)
        weakref.finalize(storage, self._release, key)

    def _release(self, key: int) -> None:
        self.live -= self._sizes.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for item in tree_flatten(out)[0]:
            if isinstance(item, torch.Tensor) and item.device.type == self.device_type:
                self._track(item)
        return out


def peak_bytes(step: Callable[[], object], device: torch.device) -> int:
    """Peak tensor bytes allocated while ``step`` runs (see the module docstring)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    tracker = LiveTensorBytes()
    with tracker:
        step()
    return tracker.peak


MEMORY_METHOD = {
    "cuda": "CUDA allocator peak (max_memory_allocated) above the memory alive before the step",
    "cpu": "peak bytes of tensor storages created during the step (dispatch-mode tracking)",
}

"""A finished run's ``summary.json``: which recipe and encoding it was, what its task reports,
and where it ran (the device, the world size and the thread count, which orders float sums, so
another count gives other numbers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from posenc_cli.runs.checkpoint import atomic_write_json
from posenc_cli.runs.directory import last_metrics


def write_summary(
    out: Path,
    recipe: Any,
    model: torch.nn.Module,
    world: Any,
    device: torch.device,
    log_path: Path,
    **fields: Any,
) -> dict[str, Any]:
    """The summary of the run of ``recipe`` (a Recipe) in ``out``, with the task's ``fields``
    between who the run is and where it ran; written by rank 0 only, returned on every rank."""
    summary = {
        "recipe": recipe.source,
        "encoding": recipe.encoding.name,
        "encoding_params": recipe.encoding.params,
        "seed": recipe.seed,
        "parameters": sum(p.numel() for p in model.parameters()),
        **fields,
        "device": device.type,
        "world_size": world.size,
        "threads": torch.get_num_threads(),
        "final": last_metrics(log_path) if world.main else {},
    }
    if world.main:
        atomic_write_json(out / "summary.json", summary)
    return summary

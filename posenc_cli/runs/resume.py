"""Going on from ``last.pt``, for every task: the weights and the optimiser back, the log cut
back to the checkpoint (a killed run may have logged past it), and where the loop starts."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from posenc_cli.runs.cadence import Cadence
from posenc_cli.runs.checkpoint import load_checkpoint
from posenc_cli.runs.directory import truncate_metrics
from posenc_cli.runs.distributed import World


@dataclass(frozen=True)
class Resumed:
    steps: int  # finished steps: the loop starts at this one
    best: float  # the best validation score so far
    state: dict[str, Any]  # the whole checkpoint, for what a task saved beside the weights


def resume_from(
    last: Path, model, optimizer, world: World, log_path: Path, cadence: Cadence
) -> Resumed | None:
    """Load ``last`` into model and optimizer; ``None`` when there is nothing to resume."""
    if not last.is_file():
        return None
    state = load_checkpoint(last)
    warn_of_other_threads(last, state, model, world)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    steps = cadence.steps_done(state)
    if world.main:
        truncate_metrics(log_path, steps)
    return Resumed(steps, float(state["best"]), state)


def warn_of_other_threads(last: Path, state: dict[str, Any], model, world: World) -> None:
    """One line on stderr when a CPU run resumes under another thread count than it was saved
    under: the float sums then add up in another order, and the run no longer ends where the
    uninterrupted one would (README, reverse). Not refused: the run is still a valid run."""
    saved, now = state.get("threads"), torch.get_num_threads()
    on_cpu = next(model.parameters()).device.type == "cpu"
    if world.main and on_cpu and saved is not None and saved != now:
        print(
            f"warning: {last} was saved under {saved} CPU thread(s) and resumes under {now}, so "
            "the run will not end exactly where an uninterrupted one would; to repeat it, "
            f"resume with OMP_NUM_THREADS={saved}",
            file=sys.stderr,
        )

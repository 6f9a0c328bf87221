"""When a training loop reports and saves, and how its checkpoints say where they are.

Every task counts optimiser steps; a period is the stretch between two reports (validation, a
log line, ``best.pt``). An image or detection period is an epoch, and a checkpoint records
finished epochs; a text period is ``train.eval_every`` steps, and a checkpoint records finished
steps, also saved every ``train.checkpoint_every`` steps. The last step always reports and
saves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Cadence:
    total: int  # steps in the whole run
    report_every: int  # steps in a period
    save_every: int  # steps between two saves of last.pt
    unit: str = "step"  # what a checkpoint counts: "step" or "epoch"
    unit_steps: int = 1  # steps in one unit

    @classmethod
    def steps(cls, total: int, report_every: int, save_every: int) -> Cadence:
        return cls(total, report_every, save_every)

    @classmethod
    def epochs(cls, epochs: int, per_epoch: int) -> Cadence:
        return cls(epochs * per_epoch, per_epoch, per_epoch, "epoch", per_epoch)

    def reports(self, done: int) -> bool:
        """Whether a period ends once ``done`` steps are finished."""
        return done % self.report_every == 0 or done == self.total

    def saves(self, done: int) -> bool:
        return done % self.save_every == 0 or done == self.total

    @property
    def saves_anywhere(self) -> bool:
        """Whether a stopped run may save where it stopped: a text step draws its randomness
        from (seed, step) and resumes exactly at any step; an epoch draws its data order as a
        whole, so an epoch task resumes at an epoch's start and keeps its last save."""
        return self.unit == "step"

    def position(self, done: int) -> dict[str, int]:
        """The checkpoint entry that says where the run is: ``{"epoch": 3}``, ``{"step": 400}``."""
        return {self.unit: done // self.unit_steps}

    def steps_done(self, state: dict[str, Any]) -> int:
        """The steps finished at a checkpoint, read back from its ``position``."""
        return int(state[self.unit]) * self.unit_steps

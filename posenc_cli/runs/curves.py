"""Training curves where researchers look at them: TensorBoard event files in ``RUN/tensorboard``
beside ``metrics.jsonl``, one scalar per logged figure, written by rank 0 when
``train.tensorboard`` is on. A resumed run purges the events past its checkpoint, as the log is
cut back to it, so the curves show one run, not two overlapping ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def tag(key: str) -> str:
    """``train_loss`` -> ``train/loss``, ``val_top1`` -> ``val/top1``; others stay as they are."""
    head, _, rest = key.partition("_")
    return f"{head}/{rest}" if head in ("train", "val") and rest else key


class Curves:
    def __init__(self, run_dir: Path, enabled: bool, resumed_at: int = 0) -> None:
        """``resumed_at``: the step of the checkpoint a run goes on from (0 for a new run); the
        events logged after it are purged."""
        self.writer = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            purge = resumed_at + 1 if resumed_at else None
            self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=purge)

    def add(self, row: dict[str, Any]) -> None:
        """One metrics.jsonl line: every number in it at its ``step``."""
        if self.writer is None:
            return
        for key, value in row.items():
            if key != "step" and isinstance(value, int | float) and not isinstance(value, bool):
                self.writer.add_scalar(tag(key), value, row["step"])
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

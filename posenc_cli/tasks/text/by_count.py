"""Exact match at each count of ones (`posenc evaluate --by-count`, parity tasks).

A parity run can pass its fit line on fair bits and still answer a constant from some count of
ones on: at n=20, 15 or more ones come in 2 % of fair problems, so a run that answers "even" to
all of them loses about 1 %. Here every count from 0 to n is drawn equally often (the draw of
``data.ones: uniform``), and each count's exact match is reported per length, which also tells
a run that fails past its range because the inputs are longer from one that fails because they
hold more ones than it can count.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from posenc_cli.data.scoring import exact_rows
from posenc_cli.errors import UsageError


def check_countable(task: Any) -> None:
    """Only parity tasks draw their count of ones."""
    if not hasattr(task, "test_ones"):
        name = getattr(task, "name", "language-model")
        raise UsageError(
            f"--by-count: a {name} run has no count of ones to sort problems by; use it with "
            "parity or parity-scratchpad"
        )


class CountTally:
    """Right and drawn problems per count of ones, per evaluated length."""

    def __init__(self, task: Any) -> None:
        self.task = task
        self.right: dict[int, list[int]] = {}
        self.drawn: dict[int, list[int]] = {}

    def add(self, length: int, batch: Any, logits: Tensor) -> None:
        bits = batch.tokens[:, self.task.layout(length).input] - self.task.symbol_offset
        ones = bits.sum(1).tolist()
        right = exact_rows(logits.argmax(-1).cpu(), batch.targets).tolist()
        drawn = self.drawn.setdefault(length, [0] * (length + 1))
        hits = self.right.setdefault(length, [0] * (length + 1))
        for count, ok in zip(ones, right, strict=True):
            drawn[count] += 1
            hits[count] += int(ok)

    def accuracy(self) -> dict[str, list[float | None]]:
        """Length -> exact match at 0..n ones (None for a count no problem had)."""
        return {
            str(n): [
                h / d if d else None for h, d in zip(self.right[n], self.drawn[n], strict=True)
            ]
            for n in sorted(self.right)
        }


def count_rows(by_length: dict[str, list[float | None]]) -> tuple[list[str], list[list[str]]]:
    """The table: one column per length, one row per count of ones, blank past a length's n
    (and where no problem had that count)."""
    longest = max(len(v) for v in by_length.values())
    rows = []
    for count in range(longest):
        cells = []
        for accuracy in by_length.values():
            value = accuracy[count] if count < len(accuracy) else None
            cells.append("" if value is None else f"{value:.3f}")
        rows.append([str(count), *cells])
    return ["ones", *(f"n={n}" for n in by_length)], rows

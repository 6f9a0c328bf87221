"""Accuracy at each answer position (`posenc evaluate --by-position`).

Per-token accuracy and exact match average over the whole answer, but where a run fails is
often one place: on addition every encoding got its carry out and end token right and its lower
digits at chance, which the 0.2 per token hid (README, addition). A test batch holds one problem
size and no padding, so every row scores the same columns: answer position k (the end token
last) is counted over all rows and batches of its length.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from posenc_cli.data.batch import IGNORE


class PositionTally:
    """Right and scored counts per answer position, per evaluated length."""

    def __init__(self) -> None:
        self.right: dict[int, Tensor] = {}
        self.scored: dict[int, Tensor] = {}

    def add(self, length: int, batch: Any, logits: Tensor) -> None:
        targets = batch.targets  # (B, T)
        scored = targets != IGNORE
        answer = scored.any(0)  # the scored columns, the same in every row of a test batch
        right = (logits.argmax(-1).cpu() == targets) & scored
        count, hits = scored[:, answer].sum(0), right[:, answer].sum(0)  # (K,)
        if length in self.right:
            hits, count = hits + self.right[length], count + self.scored[length]
        self.right[length], self.scored[length] = hits, count

    def accuracy(self) -> dict[str, list[float]]:
        """Length -> accuracy at answer positions 1..K, the last one the end token."""
        return {
            str(n): (self.right[n].double() / self.scored[n]).tolist() for n in sorted(self.right)
        }


def position_rows(by_length: dict[str, list[float]]) -> tuple[list[str], list[list[str]]]:
    """The table: one column per length, one row per answer position (the end token's row
    last, as each length's own last entry), blank where a length's answer is shorter."""
    lengths = list(by_length)
    longest = max((len(v) for v in by_length.values()), default=0)
    rows = []
    for k in range(longest - 1):
        cells = [f"{v[k]:.3f}" if k < len(v) - 1 else "" for v in by_length.values()]
        rows.append([str(k + 1), *cells])
    rows.append(["end", *(f"{v[-1]:.3f}" for v in by_length.values())])
    return ["position", *(f"n={n}" for n in lengths)], rows

"""The problems a run gets wrong, one by one (`posenc evaluate --misses FILE`).

Exact match says how many test problems a run misses, not which. Which is often the finding:
the parity runs that never fit their range miss the problems with the most ones, the same
ones whatever the encoding (README, parity). One JSON line per missed problem, in the task's
own symbols: ``{"length", "batch", "row", "input", "target", "predicted"}``, where target and
predicted cover the scored answer and its end (``"EOS"``), specials are named and index hints
are ``h<k>``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from posenc_cli.data.algorithmic import BOS, EOS, PAD, PLUS, SEP
from posenc_cli.data.batch import IGNORE
from posenc_cli.data.scoring import exact_rows
from posenc_cli.errors import UsageError
from posenc_cli.runs.checkpoint import atomic_write_text

SPECIALS = {PAD: "PAD", BOS: "BOS", SEP: "SEP", EOS: "EOS", PLUS: "+"}


def check_listable(task: Any, flag: str, lacks: str) -> None:
    """Only the algorithmic tasks have problems laid out as input, separator and answer
    (``flag`` names the option asking, ``lacks`` what the others do not have)."""
    if not hasattr(task, "layout"):
        raise UsageError(
            f"{flag}: a {getattr(task, 'name', 'language-model')} run {lacks}; use it with an "
            "algorithmic task (copy, reverse, sort, parity, ...)"
        )


def symbol(task: Any, token: int) -> int | str:
    """A symbol as its value, a special by name, an index hint (addition-hints) as ``h<k>``."""
    if token >= task.symbol_offset:
        return token - task.symbol_offset
    return SPECIALS.get(token) or f"h{token - task.first_hint}"


def missed(task: Any, length: int, batch: int, tokens, targets, logits) -> list[dict[str, Any]]:
    """The rows of one test batch whose answer is not right at every position, decoded."""
    predicted = logits.argmax(-1).cpu()
    scored = targets != IGNORE
    wrong = scored.any(1) & ~exact_rows(predicted, targets)  # what exact match counts against
    inputs = task.layout(length).input
    records = []
    for row in torch.nonzero(wrong).flatten().tolist():
        where = scored[row]
        records.append(
            {
                "length": length,
                "batch": batch,
                "row": row,
                "input": [symbol(task, t) for t in tokens[row, inputs].tolist()],
                "target": [symbol(task, t) for t in targets[row, where].tolist()],
                "predicted": [symbol(task, t) for t in predicted[row, where].tolist()],
            }
        )
    return records


def write_misses(path: Path, records: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)  # as --out does: folders made on the way
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in records))

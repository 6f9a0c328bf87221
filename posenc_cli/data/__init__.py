"""Tasks for the text experiments, behind one registry: ``build_task(cfg) -> Task``.

``TASKS`` is a plain dict from the recipe's ``data.task`` name to the task class; every class
has ``from_config(cfg)``, which reads only the fields it needs (``vocab``, ``train_lengths``,
``corpus``, ``val_fraction``), so any object with those attributes works as ``cfg``.
"""

from __future__ import annotations

from typing import Any

from posenc_cli.data.algorithmic import (
    Addition,
    AdditionHints,
    AlgorithmicTask,
    Copy,
    Layout,
    Parity,
    ParityScratchpad,
    Recall,
    Reverse,
    Sort,
    Summation,
    SummationScratchpad,
)
from posenc_cli.data.batch import IGNORE, Batch, Task
from posenc_cli.data.scoring import Score, score
from posenc_cli.data.text import TextTask
from posenc_cli.data.word_order import WordOrder
from posenc_cli.errors import UsageError
from posenc_cli.params import close_match

TASKS: dict[str, type[AlgorithmicTask] | type[WordOrder] | type[TextTask]] = {
    "copy": Copy,
    "reverse": Reverse,
    "sort": Sort,
    "recall": Recall,
    "addition": Addition,
    "addition-hints": AdditionHints,
    "summation": Summation,
    "parity": Parity,
    "summation-scratchpad": SummationScratchpad,
    "parity-scratchpad": ParityScratchpad,
    "word-order": WordOrder,
    "text": TextTask,
}


def build_task(cfg: Any) -> Task:
    """The task named by ``cfg.task``; a bad name or value is a UsageError naming the key."""
    name = cfg.task
    if name not in TASKS:
        raise UsageError(
            f"data.task: unknown task {name!r}{close_match(str(name), TASKS)}; "
            f"valid: {', '.join(TASKS)}"
        )
    return TASKS[name].from_config(cfg)


__all__ = [
    "IGNORE",
    "TASKS",
    "AlgorithmicTask",
    "Batch",
    "Layout",
    "Score",
    "Task",
    "TextTask",
    "WordOrder",
    "build_task",
    "score",
]

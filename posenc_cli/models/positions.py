"""Randomized positions (Ruoss et al. 2023, "Randomized Positional Encodings Boost Length
Generalization of Transformers", ACL 2023).

A sequence of ``length`` tokens is given the positions of a sorted random subset of
``[0, span)`` instead of ``0 .. length - 1``. Trained on short sequences with a large ``span``,
the model has seen every position (and every distance up to ``span``) that a longer test
sequence will use, so no test position is out of distribution. Training and evaluation draw by
the same rule. Deviation: one draw per batch (the positions tensor is shared by its rows), not
one per sequence.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc_cli.errors import UsageError


def random_positions(length: int, span: int, generator: torch.Generator) -> Tensor:
    """``length`` distinct positions of ``[0, span)``, ascending, ``(length,)`` long."""
    if length > span:
        raise UsageError(
            f"model.random_positions: a sequence of {length} tokens needs {length} distinct "
            f"positions but the span is {span}; raise model.random_positions to at least {length}"
        )
    return torch.randperm(span, generator=generator)[:length].sort().values

"""A run directory: made or refused, its resolved recipe, its metrics log (one JSON line per
log, cut back to the checkpoint when a run resumes), and the stop that a NaN loss causes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from posenc_cli.errors import UsageError
from posenc_cli.runs.checkpoint import atomic_write_text

DIVERGED = "diverged.json"  # a run whose loss became NaN: a result a sweep records


class TrainingStopped(RuntimeError):
    """The run cannot go on (a NaN loss); the message says why and what was kept."""


def record_divergence(run: Any, out: Path, why: str) -> None:
    """Say in the folder of ``run`` (its Recipe) that it diverged, with the keys ``compare``
    groups runs by, so that a sweep counts divergence per encoding instead of losing it."""
    identity = {
        "kind": run.kind,
        "encoding": run.encoding.name,
        "encoding_params": run.encoding.params,
        "seed": run.seed,
    }
    atomic_write_text(out / DIVERGED, json.dumps({**identity, "reason": why}, indent=2))


def prepare_directory(out: Path, resume: bool) -> None:
    if out.exists() and (out / "last.pt").exists() and not resume:
        raise UsageError(
            f"{out} already holds a run; add --resume to continue it or choose another --out"
        )
    out.mkdir(parents=True, exist_ok=True)


def append_metrics(path: Path, row: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def truncate_metrics(path: Path, step: int) -> None:
    """Drop log lines written after the checkpoint a resumed run starts from."""
    if not path.is_file():
        return
    rows = [line for line in path.read_text().splitlines() if line.strip()]
    kept = [line for line in rows if json.loads(line)["step"] <= step]
    atomic_write_text(path, "".join(line + "\n" for line in kept))


def last_metrics(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return json.loads(lines[-1]) if lines else {}

"""A sweep's results in one small JSON file: every run's evaluation (and its training summary),
without checkpoints or curves, so that results outlive the run directories.

``posenc export`` writes it; ``compare``, ``rank`` and ``report`` read it wherever they read a
sweep directory, and give the same tables. A results file is what a project commits beside its
README: the tables can be checked and regrouped later, and a study of six tasks can be gathered
over several machines or sessions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from posenc_cli.errors import UsageError

SCHEMA = "posenc.results/1"
SUMMARY = "summary.json"

Entries = list[dict[str, Any]]  # as the file holds them: {"name", "evaluation" | "record", ...}


def read(path: Path) -> tuple[Entries, Entries] | None:
    """A results file's runs and diverged runs, each checked as in a run folder; None where
    ``path`` is not a results file (its schema does not say ``posenc export`` wrote it). One
    that says so but is damaged is one line with the fix."""
    from posenc_cli.compare import divergence_ok, well_formed

    if not path.is_file() or path.suffix != ".json":
        return None
    try:
        doc = json.loads(path.read_text())
    except ValueError:  # not JSON: nothing says it was meant as a results file
        return None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        return None
    fix = "write it again with `posenc export SWEEP --out FILE.json`"
    runs, stopped = doc.get("runs"), doc.get("diverged", [])
    shape_ok = (
        isinstance(runs, list)
        and isinstance(stopped, list)
        and all(isinstance(e, dict) and isinstance(e.get("name"), str) for e in runs + stopped)
        and all(well_formed(e.get("evaluation")) for e in runs)
        and all(divergence_ok(e.get("record")) for e in stopped)
    )
    if not shape_ok:
        raise UsageError(f"{path}: damaged (not a results file posenc writes); {fix}")
    if not runs and not stopped:
        raise UsageError(f"{path}: holds no run; {fix} from a sweep that has finished runs")
    return runs, stopped


def optional_json(path: Path) -> dict[str, Any] | None:
    """A run's summary: kept where it reads, left out (not fatal) where it does not."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def export(paths: list[Path]) -> dict[str, Any]:
    """The results file's content for the runs below ``paths``: sweep or run directories (each
    run read and checked as ``compare`` reads it, so a damaged run is refused here, not found
    later) and earlier results files, merged; a sweep run in parts over several sessions becomes
    one file. A run named twice is refused: one of the two would be silently dropped."""
    runs: Entries = []
    stopped: Entries = []
    seen: dict[str, Path] = {}
    for path in paths:
        found, dead = entries(path)
        for entry in found + dead:
            if entry["name"] in seen:
                raise UsageError(
                    f"{entry['name']}: in both {seen[entry['name']]} and {path}; export each run "
                    "once (leave one of them out)"
                )
            seen[entry["name"]] = path
        runs += found
        stopped += dead
    return {"schema": SCHEMA, "sources": [str(p) for p in paths], "runs": runs, "diverged": stopped}


def entries(path: Path) -> tuple[Entries, Entries]:
    """A directory's or an earlier results file's runs and diverged runs, as the file holds them."""
    from posenc_cli.compare import DIVERGED, read_divergence, read_evaluation, run_folders

    earlier = read(path)  # checked whole before anything of it is copied
    if earlier is not None:
        return earlier
    evaluated, diverged = run_folders([path])
    runs = []
    for folder in evaluated:
        entry = {"name": folder.name, "evaluation": read_evaluation(folder / "eval.json")}
        summary = optional_json(folder / SUMMARY)
        if summary is not None:
            entry["summary"] = summary  # steps trained, wall time: what a README quotes
        runs.append(entry)
    stopped = [
        {"name": folder.name, "record": read_divergence(folder / DIVERGED)} for folder in diverged
    ]
    return runs, stopped

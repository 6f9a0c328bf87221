"""Checkpoints that never break and never run code.

Writes go to a temporary file in the same folder and are renamed over the old one, so a kill at
any moment leaves either the previous checkpoint or the new one, never half of one. Loading uses
``torch.load(weights_only=True)``: a checkpoint from elsewhere can carry tensors and plain
containers only, never a pickled object that runs code when it is read.
"""

from __future__ import annotations

import json
import os
import pickle
import pickletools
import sys
import zipfile
from pathlib import Path
from typing import Any

import torch

from posenc_cli.errors import UsageError


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: Path, payload: Any) -> None:
    atomic_write_text(path, json.dumps(payload, indent=2) + "\n")


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    # the thread count orders the CPU's float sums: a resume under another count drifts
    torch.save({**state, "threads": torch.get_num_threads()}, tmp)
    os.replace(tmp, path)


class CorruptCheckpoint(UsageError):
    """A checkpoint that cannot be read at all (truncated, overwritten), as opposed to one that
    is read and refused for what it holds: only the first may be passed over for another."""


# opcodes that name a callable: a bare pickle with one carries code, torch or not
CODE_OPCODES = {"GLOBAL", "STACK_GLOBAL", "INST", "EXT1", "EXT2", "EXT4"}


def refusal(path: Path, err: Exception) -> str | None:
    """Why ``weights_only`` refused an intact file for its contents; ``None`` when the file is
    damaged. Both raise the same errors (random bytes read as "unsupported" opcodes), so the
    file's own structure decides."""
    if not isinstance(err, pickle.UnpicklingError):
        return None
    text = str(err)
    if "Unsupported global" in text:  # a torch archive naming a class or function
        return text[text.index("Unsupported global") :].splitlines()[0].split(". ")[0]
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                intact = archive.testzip() is None  # every member's CRC
        except Exception:  # any failure to read the archive means damage
            intact = False
        return "it holds objects other than tensors and plain data" if intact else None
    try:  # a bare pickle: refused only if it parses to its end and names a callable
        with open(path, "rb") as f:
            opcodes = {op.name for op, _, _ in pickletools.genops(f)}
    except Exception:  # truncated or not a pickle at all
        return None
    return "it holds pickled objects that would run code" if opcodes & CODE_OPCODES else None


def load_checkpoint(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise UsageError(f"{path}: no checkpoint here; train first or name a run directory")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a refusal or a damaged file: say which, in one line
        reason = refusal(path, err)
        if reason is not None:
            raise UsageError(
                f"{path}: refused to load (only tensors and plain data are accepted): {reason}; "
                "load only checkpoints that posenc train wrote"
            ) from None
        raise CorruptCheckpoint(
            f"{path}: the checkpoint is corrupt or truncated (torch cannot read it); delete it "
            "and train the run again, or restore the file from a copy"
        ) from None
    if not isinstance(state, dict):
        raise CorruptCheckpoint(
            f"{path}: not a posenc checkpoint (it holds a {type(state).__name__}, not a dict); "
            "delete it and train the run again, or restore the file from a copy"
        )
    return state


def load_run_checkpoint(run_dir: Path) -> tuple[Path, dict[str, Any]]:
    """The checkpoint an evaluation reads: best.pt, else last.pt. A damaged best.pt gives way to
    last.pt with one line on stderr; a refused one does not (a planted file is no accident)."""
    best, last = run_dir / "best.pt", run_dir / "last.pt"
    if not best.is_file() and not last.is_file():
        raise UsageError(
            f"{run_dir}: no checkpoint (best.pt or last.pt); train the run first, or continue "
            "it with `posenc train RECIPE --out RUN --resume`"
        )
    if not best.is_file():
        return last, load_checkpoint(last)
    try:
        return best, load_checkpoint(best)
    except CorruptCheckpoint:
        if not last.is_file():
            raise
    try:
        state = load_checkpoint(last)
    except CorruptCheckpoint:
        raise CorruptCheckpoint(
            f"{run_dir}: best.pt and last.pt are both corrupt or truncated; train the run again "
            "into a new --out folder, or restore them from a copy"
        ) from None
    print(f"warning: {best} is corrupt or truncated; evaluating {last} instead", file=sys.stderr)
    return last, state


def load_run_weights(run_dir: Path, model: torch.nn.Module, ema: bool = False) -> Path:
    """Load a run's weights (its EMA copy when ``ema`` and saved) into ``model``; returns the
    checkpoint read. Weights that do not fit (an override changed the model) are one line."""
    path, state = load_run_checkpoint(run_dir)
    weights = (state.get("ema") if ema else None) or state.get("model")
    if not isinstance(weights, dict):
        raise CorruptCheckpoint(
            f"{path}: holds no model weights; delete it and train the run again, or restore "
            "the file from a copy"
        )
    try:
        model.load_state_dict(weights)
    except RuntimeError as err:  # "Error(s) in loading state_dict ...:\n\tsize mismatch for x: ..."
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        detail = lines[1].split(":")[0] if len(lines) > 1 else "a different model"
        raise UsageError(
            f"{path}: the weights do not fit the model the recipe builds ({detail}); evaluate "
            "without overrides that change model.* or encoding.*"
        ) from None
    return path

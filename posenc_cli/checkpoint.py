"""Checkpoints that never break and never run code.

Writes go to a temporary file in the same folder and are renamed over the old one, so a kill at
any moment leaves either the previous checkpoint or the new one, never half of one. Loading uses
``torch.load(weights_only=True)``: a checkpoint from elsewhere can carry tensors and plain
containers only, never a pickled object that runs code when it is read.
"""

from __future__ import annotations

import json
import os
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
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise UsageError(f"{path}: no checkpoint here; train first or name a run directory")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # an unpickling refusal or a corrupt file: say which, in one line
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        named = [line for line in lines if "Unsupported" in line or "global" in line.lower()]
        reason = (named or lines or ["unreadable file"])[0][:200]
        raise UsageError(
            f"{path}: refused to load (only tensors and plain data are accepted): {reason}"
        ) from None

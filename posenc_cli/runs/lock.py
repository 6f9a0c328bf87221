"""One writer per run directory.

A process that trains or evaluates into a folder holds an advisory lock on ``FOLDER/.lock``
(``fcntl.flock``): a second ``posenc train`` into the same ``--out`` exits with the holder's
name instead of mixing two runs' files. The kernel drops the lock when the holder exits, however
it exits, so a killed run never leaves a stale lock behind. Locks are re-entrant inside one
process: a sweep holds its folder while each run holds its own.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from posenc_cli.errors import UsageError

LOCK_NAME = ".lock"
_held: set[Path] = set()  # folders this process holds


@contextmanager
def hold(folder: Path) -> Iterator[None]:
    """Lock ``folder`` (made if missing) for this process while the block runs. A folder made
    here that the block leaves with nothing but the lock in it (bad input found before anything
    was written) is removed again, so a refused command leaves no empty run folder behind."""
    key = folder.resolve()
    if key in _held:  # held further out in this process: the outer holder releases it
        yield
        return
    made = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 1000).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise UsageError(
            f"{folder} is being written by {holder}; wait for it to finish or choose another --out"
        ) from None
    os.ftruncate(fd, 0)
    command = " ".join(["posenc", *sys.argv[1:]])[:200]
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    os.write(
        fd, f"process {os.getpid()} on {socket.gethostname()} ({command}, since {started})".encode()
    )
    _held.add(key)
    try:
        yield
    finally:
        _held.discard(key)
        os.ftruncate(fd, 0)  # no stale holder's name for the next reader
        os.close(fd)  # releases the lock
        if made and [p.name for p in folder.iterdir()] == [LOCK_NAME]:
            (folder / LOCK_NAME).unlink()
            folder.rmdir()

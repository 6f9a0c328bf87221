"""SIGTERM ends a run as Ctrl-C does: the last checkpoint is saved and ``--resume`` goes on.

Schedulers (Slurm, Kubernetes, torchrun when another rank fails) send SIGTERM some time before
a kill. By default it ends Python at once, without a checkpoint; here it raises ``Terminated``,
a ``KeyboardInterrupt``, in the main thread, so every loop's interrupt path saves and exits.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Terminated(KeyboardInterrupt):
    """The process was sent SIGTERM."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While the block runs, SIGTERM raises ``Terminated`` (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

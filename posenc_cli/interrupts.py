"""Ctrl-C that always ends a command, even while the main thread is inside one long C++ op.

Python runs its SIGINT handler only between bytecodes, so a KeyboardInterrupt waits for a
matrix product of minutes to finish. The C-level handler does write the signal's number to
the wakeup fd (``signal.set_wakeup_fd``) at once, though, and torch releases the GIL inside its
ops: a daemon thread reading the other end of that socket sees the signal, gives the main
thread ``grace_s`` to raise its KeyboardInterrupt and unwind, and otherwise prints the message
and ends the process with status 130 (128 + SIGINT), as a shell does for Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

GRACE_S = 2.0
INTERRUPTED = 130  # 128 + SIGINT, a shell's status for Ctrl-C
STOPPING = {signal.SIGINT, signal.SIGTERM}  # SIGTERM counts where a Python handler catches it


def _watch(reader: socket.socket, done: threading.Event, message: str, grace_s: float) -> None:
    while True:
        try:
            received = reader.recv(64)
        except OSError:
            return
        if not received:  # the block ended and closed the writing end
            return
        if not STOPPING & set(received):  # another signal with a handler (SIGCHLD, SIGWINCH)
            continue
        if done.wait(grace_s):
            return
        os.write(2, f"{message}\n".encode())  # fd 2 itself: sys.stderr may be replaced
        os._exit(INTERRUPTED)


@contextmanager
def hard_interrupt(message: str, grace_s: float = GRACE_S) -> Iterator[None]:
    """Inside the block, Ctrl-C ends the command within ``grace_s`` seconds with ``message``
    on stderr: as a KeyboardInterrupt (re-raised, so callers clean up) when the main thread
    gets back to Python in time, else by ``os._exit(130)``. The previous wakeup fd is restored
    on the way out, so code around the block (in-process tests) sees no change."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach only the main thread; nothing to watch here
        return
    reader, writer = socket.socketpair()
    writer.setblocking(False)  # set_wakeup_fd needs a non-blocking fd
    done = threading.Event()
    previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    watchdog = threading.Thread(
        target=_watch, args=(reader, done, message, grace_s), name="interrupt-watchdog", daemon=True
    )
    watchdog.start()
    try:
        yield
    except KeyboardInterrupt:
        done.set()  # before printing: the watchdog must not print the line a second time
        print(message, file=sys.stderr)
        raise
    finally:
        done.set()
        signal.set_wakeup_fd(previous)
        writer.close()  # ends the watchdog's recv
        watchdog.join(timeout=1.0)
        reader.close()


def forget_handled_interrupt() -> None:
    """Before exiting with ``INTERRUPTED``: CPython remembers a KeyboardInterrupt that left an
    ``exec`` of source text (dataclasses builds its methods that way, so a Ctrl-C during an
    import can land in one) and at exit kills the process with SIGINT although the interrupt
    was handled, status -2 instead of 130. Every ``exec`` of text clears that memory as it
    starts, so an empty one does."""
    exec("")  # noqa: S102

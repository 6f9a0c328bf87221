"""posenc_cli/allocator.py: freed memory stays in the process, so a second large allocation of
the same size is served without page faults; ``POSENC_KEEP_MEMORY=0`` leaves glibc's default,
under which it is unmapped and faulted in again page by page."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

REALLOCATE = """
import ctypes, resource
from posenc_cli.allocator import keep_freed_memory
kept = keep_freed_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
size = 64 * 2**20
def touched():
    address = libc.malloc(size)
    ctypes.memset(address, 1, size)  # every page written: faulted in unless already mapped
    return address
libc.free(ctypes.c_void_p(touched()))
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
touched()
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def reallocation(keep: str) -> tuple[bool, int]:
    env = {**os.environ, "POSENC_KEEP_MEMORY": keep}
    out = subprocess.run(
        [sys.executable, "-c", REALLOCATE], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0] == "True", int(out[1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_a_freed_block_is_reused_without_page_faults():
    kept, faults = reallocation("1")
    assert kept and faults < 100
    kept, faults = reallocation("0")  # glibc's default: 64 MB come from mmap, 16,384 pages
    assert not kept and faults > 10_000

"""Keep freed memory inside the process instead of handing it back to the system.

glibc's malloc serves a large request (from 128 KB, rising with use to at most 32 MB) with its
own ``mmap`` and unmaps it when freed, and trims the top of its heap once enough there is free.
A training step allocates and frees tensors of megabytes (a block's bias, a tile's softmax
weights) over and over, so each is faulted in again page by page: a causal Transformer-XL layer
at 1,024 tokens took 70,000-90,000 page faults per step. Served from a heap that is never
trimmed (until 2 GB of it is free), the same step takes none once warm. The price is that the
process keeps the memory of its largest step; ``POSENC_KEEP_MEMORY=0`` leaves the allocator as
it is. The ``posenc`` command and the CPU benchmarks call this first.
"""

from __future__ import annotations

import ctypes
import os
import platform

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # mallopt's parameters, from glibc's malloc.h
SWITCH = "POSENC_KEEP_MEMORY"


def keep_freed_memory() -> bool:
    """Tell glibc to serve every request from its heap and not to trim it; whether it did
    (False off glibc, or with ``POSENC_KEEP_MEMORY=0``)."""
    if os.environ.get(SWITCH, "1") == "0" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    no_mmap = libc.mallopt(M_MMAP_MAX, 0) == 1  # mallopt returns 1 on success
    return libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1) == 1 and no_mmap

"""Process-wide settings for a command-line run: torch threads and the C allocator.

Both are set by the ``isouq`` command (never on library import): a library must not change
its host process. Python users who want the same call :func:`configure` themselves.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters (malloc.h)


def tune_allocator() -> bool:
    """Keep freed CPU tensor memory in the process (glibc only); returns whether it applied.

    glibc returns large freed blocks to the OS and maps fresh, zero-filled pages for the next
    allocation; a backward pass allocating gradients layer after layer then spends much of its
    time in page faults. Raising the mmap threshold to its maximum (32 MiB) and disabling trimming
    keeps those pages for reuse, as jemalloc/tcmalloc do (measured: the forward+backward of
    ghost norms on SmolLM2 at batch 16 ≈ 10–20% faster; ``benchmarks/score_sequences.py``).
    ``ISOUQ_MALLOC_TUNING=0`` turns it off.
    """
    if os.environ.get("ISOUQ_MALLOC_TUNING", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl or another libc: nothing to tune
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, 32 * 2**20) == 1
    return bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1 and ok)


def set_threads() -> None:
    """``ISOUQ_THREADS=N``: torch intra-op threads (e.g. 1 per process when several share a CPU)."""
    n = os.environ.get("ISOUQ_THREADS")
    if n:
        import torch

        torch.set_num_threads(int(n))


def configure() -> None:
    """What the ``isouq`` command sets before any work: allocator, then threads."""
    tune_allocator()
    set_threads()

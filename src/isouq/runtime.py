"""Process-wide settings for a command-line run: torch threads, the C allocator, the known
noise of third-party imports; and the reading of isouq's environment variables.

The settings are applied by the ``isouq`` command (never on library import): a library must
not change its host process. Python users who want the same call :func:`configure` and
:func:`quiet_library_noise` themselves. Environment variables (``ISOUQ_*``) are read where
their value is used (:func:`env_int`), never at import, so a process may set them late.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys

from .errors import InputError

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
    n = env_int("ISOUQ_THREADS", 0, low=0)  # 0 or unset: torch's own choice
    if n:
        import torch

        torch.set_num_threads(n)


def configure() -> None:
    """What the ``isouq`` command sets before any work: allocator, then threads."""
    tune_allocator()
    set_threads()


def env_int(name: str, default: int, *, low: int | None = None) -> int:
    """The whole number the environment variable ``name`` holds now, else ``default``.

    Args:
        name: e.g. ``"ISOUQ_CHUNK_BYTES"``.
        default: the value when the variable is unset or blank.
        low: the least value accepted, if any.

    Returns:
        The value, read at this call (not cached).

    Raises:
        InputError: naming the variable, when it is not a whole number (or is below ``low``).
    """
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or (low is not None and value < low):
        need = "a whole number" + (f" ≥ {low}" if low is not None else "")
        raise InputError(f"{name}={text!r} is not {need}; unset it or give one, e.g. "
                         f"{name}={default}")
    return value


#: (logger, start of the message) of the warnings third-party libraries log on import about
#: optional native kernels isouq never calls; :func:`quiet_library_noise` drops exactly these
LIBRARY_NOISE: tuple[tuple[str, str], ...] = (
    # torchao's C++/CUDA extensions (_C*.so) built for another Python or GPU: isouq reads a
    # torchao weight as its dequantized values and calls none of them
    ("torchao", "Failed to load "),
    # torchao registering its Enums as pytree constants, deprecated by newer torch
    ("torch.utils._pytree", "%s is an Enum subclass and is now natively supported"),
    # bitsandbytes' optional CPU kernel from the Hugging Face hub (the `kernels` package); it
    # falls back to its own
    ("bitsandbytes.backends.cpu.ops", "Failed to load CPU gemm_4bit_forward from "
                                      "kernels-community"),
)


class _DropStart(logging.Filter):
    """Drops a logger's records whose message (its format string) starts with ``start``."""

    def __init__(self, start: str) -> None:
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.start)


def quiet_library_noise() -> None:
    """Drop the import-time warnings of :data:`LIBRARY_NOISE`, and only those.

    Each is filtered on its own logger (``torchao``, ``torch.utils._pytree``, …) by the start
    of its message; every other record of those loggers, errors included, still shows. Cheap
    and idempotent: no library is imported.
    """
    for name, start in LIBRARY_NOISE:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropStart) and f.start == start for f in logger.filters):
            logger.addFilter(_DropStart(start))

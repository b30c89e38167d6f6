"""The C heap under Piper's inferences: fewer glibc heaps, and free pages handed back when idle."""

from __future__ import annotations

import ctypes
import os
import platform


def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc (``malloc_trim``, ``mallopt``), else None (musl, macOS): no tuning."""
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _glibc()
# mallopt parameter (glibc's malloc.h).
_M_ARENA_MAX = -8
# Two malloc arenas: each thread that allocates would otherwise get a heap of its own (up to 8 per core),
# each keeping its freed pages and its fragments. The mmap threshold stays glibc's (dynamic): fixing it
# low gives each freed tensor back at once, but every inference then faults its hundreds of MB of
# tensors in again, 2-3x slower (measured with 1 thread). Fixing it high (32 MiB, and the trim threshold
# at 1 GiB, so that a heap keeps its free pages for the next inference) saved 25% of CPU with one
# inference at a time in a process of its own, but only 0-5% for the engine under load
# (``bench/piper_cpu.py --engine-compare``: 117-128 ms of CPU per audio second against 126-140), for
# 150-200 MB more resident memory at the peak of 16 sessions: not taken. ``release_freed_memory`` hands
# the heap's free pages back when the engine goes idle.
_ARENAS = 2


def tune_malloc() -> None:
    """Make glibc keep fewer heaps (call before the inference threads start)."""
    if _LIBC is not None:
        _LIBC.mallopt(_M_ARENA_MAX, _ARENAS)


def release_freed_memory() -> None:
    """Return the C heap's free pages to the system (glibc keeps them otherwise)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a container's cpuset narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1

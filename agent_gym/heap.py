"""The C heap under Python and torch: how much of it is in use, how much is free but still
resident, and giving the free part back to the system (glibc; elsewhere these answer None/False).

A long-running process (the env server, a trainer) whose resident memory grows from one round of
work to the next either holds more objects or keeps freed heap pages: ``heap_stats`` tells the two
apart (its ``free_gib`` grows in the second case, ``in_use_gib`` in the first), and ``trim_heap``
gives the free pages back. Python's own small objects live in pymalloc arenas mapped outside
malloc, so they are in the resident set but not in these figures."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any


@functools.lru_cache(maxsize=1)
def libc() -> Any:
    """The C library (``ctypes.CDLL``), or None where it cannot be loaded."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def libc_function(name: str) -> Any:
    """The C library's function ``name`` (a ctypes function), or None where the library or the
    function is missing (``malloc_trim``, ``mallopt`` and ``mallinfo2`` are glibc's)."""
    lib = libc()
    return getattr(lib, name, None) if lib is not None else None


def trim_heap() -> bool:
    """Give the C heap's free pages back to the OS (glibc's ``malloc_trim(0)``, which releases free
    pages inside every arena, not only at each arena's top; False where there is none)."""
    fn = libc_function("malloc_trim")
    if fn is None:  # not glibc (macOS, musl): nothing to trim
        return False
    fn(0)
    return True


class _Mallinfo2(ctypes.Structure):
    _fields_ = [  # glibc's struct mallinfo2 (malloc.h, glibc >= 2.33), every field a size_t
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


@functools.lru_cache(maxsize=1)
def _mallinfo2() -> Any:
    fn = libc_function("mallinfo2")
    if fn is not None:
        fn.restype = _Mallinfo2
    return fn


def heap_stats() -> dict[str, float] | None:
    """The C heap summed over all arenas, GiB (glibc's ``mallinfo2``; None before glibc 2.33 or
    off glibc): ``in_use_gib`` (allocated blocks, the mmapped ones included), ``free_gib`` (freed
    blocks the arenas still hold: their pages stay resident until ``trim_heap`` gives them back,
    after which they still count here but no longer in the resident set) and ``mmapped_gib`` (the
    large blocks that have their own mapping and leave the process when freed)."""
    fn = _mallinfo2()
    if fn is None:
        return None
    info = fn()
    gib = 2.0**30
    return {
        "in_use_gib": (info.uordblks + info.hblkhd) / gib,
        "free_gib": info.fordblks / gib,
        "mmapped_gib": info.hblkhd / gib,
    }


__all__ = ["heap_stats", "libc", "libc_function", "trim_heap"]

"""Keep the process's memory close to what it uses, without paying for every page twice.

Decoding and training run on one thread now, but a process may have others that
allocate; glibc gives each thread its own malloc arena, and tensors freed in one
arena are not reused by another, so resident memory crept up step after step
(the math demo: 3.9 GB after 12 steps instead of 3.1 GB, at the same speed).
One arena for the whole process stops that.

A page the process touches for the first time costs a fault, in which the kernel
hands over a zeroed page: about 2 us each on this VM. A training pass over the
GRPO bench's batch touches about 1 GB (250,000 pages) of activations; when those
pages went back to the system after each micro-batch (``malloc_trim``) and every
block of 1 MB and more came from ``mmap`` (returned on free), the next pass paid
for all of them again: a quarter of its CPU time was the kernel's. So freed
memory stays in the heap, where the next request reuses it: blocks below glibc's
largest mmap threshold (32 MB) come from the heap, glibc does not shrink the heap's
top on free until ``KEEP_FREE`` bytes are free there, and :func:`release_free_memory`
(after each rollout phase, evaluation and training micro-batch) hands the free
pages back only when more than ``KEEP_FREE`` bytes are free: a step's activations
stay for the next step; fragmentation beyond that goes back (the ReAct example held
4.4 GB resident with 1.9 GB live before the heap's free middle was returned).
``MALLOC_ARENA_MAX``, ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_`` set by the user wins.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
from typing import Any

# mallopt parameter numbers, from glibc's malloc.h
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8

MMAP_THRESHOLD = 32 << 20  # bytes; glibc's largest on 64-bit; a fixed value also turns its dynamic threshold off
TIGHT_MMAP_THRESHOLD = 1 << 20  # with nothing kept: large tensors go back to the system as they are freed
KEEP_FREE = 2 << 30  # bytes of freed heap kept for reuse (a training step's activations, a decode phase's caches)
_kept = [KEEP_FREE]  # what configure_malloc() was asked to keep: the default of release_free_memory()


class _MallInfo2(ctypes.Structure):
    _fields_ = [
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


@functools.cache
def _libc() -> Any:
    """glibc, or ``None`` (another platform, or a libc without ``mallopt``/``malloc_trim``, such as musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.mallopt.restype = ctypes.c_int
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.malloc_trim.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    if hasattr(libc, "mallinfo2"):  # glibc 2.33 and later
        libc.mallinfo2.argtypes = []
        libc.mallinfo2.restype = _MallInfo2
    return libc


def _mallopt(param: int, value: int, env: str) -> bool:
    libc = _libc()
    if libc is None or env in os.environ:
        return False
    return bool(libc.mallopt(param, value))


def limit_malloc_arenas(arenas: int = 1) -> bool:
    """Ask glibc for at most ``arenas`` malloc arenas; ``False`` where that does not apply."""
    return _mallopt(_M_ARENA_MAX, arenas, "MALLOC_ARENA_MAX")


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Serve blocks of ``threshold`` bytes and more from ``mmap``, always; ``False`` where that does not apply."""
    return _mallopt(_M_MMAP_THRESHOLD, threshold, "MALLOC_MMAP_THRESHOLD_")


def keep_heap_top(threshold: int = KEEP_FREE) -> bool:
    """Let glibc shrink the heap's top on free only beyond ``threshold`` free bytes; ``False`` where that does not apply."""
    return _mallopt(_M_TRIM_THRESHOLD, threshold, "MALLOC_TRIM_THRESHOLD_")


def configure_malloc(keep_free: int = KEEP_FREE) -> None:
    """What a process that decodes and trains wants from glibc (the three settings above).

    :param keep_free: freed bytes kept for reuse. 0 gives the lowest resident memory instead: blocks
        of 1 MB and more from ``mmap`` (back to the system on free), the heap's top shrunk by glibc as
        it frees, and every :func:`release_free_memory` returns what is free.
    """
    limit_malloc_arenas()
    if keep_free > 0:
        fix_mmap_threshold()
        keep_heap_top(keep_free)
    else:
        fix_mmap_threshold(TIGHT_MMAP_THRESHOLD)
    _kept[0] = keep_free


def free_heap_bytes() -> int | None:
    """Bytes freed and held by malloc for reuse (``mallinfo2().fordblks``); ``None`` where glibc cannot tell."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        return None
    return int(libc.mallinfo2().fordblks)


def release_free_memory(keep: int | None = None) -> bool:
    """Return the heap's free pages to the system when more than ``keep`` bytes are free; ``True`` if any went back.

    ``keep`` defaults to what :func:`configure_malloc` was given. Where glibc cannot tell how much
    is free, the pages go back whatever ``keep`` says.
    """
    libc = _libc()
    if libc is None:
        return False
    keep = _kept[0] if keep is None else keep
    free = free_heap_bytes()
    if free is not None and free <= keep:
        return False
    return bool(libc.malloc_trim(0))

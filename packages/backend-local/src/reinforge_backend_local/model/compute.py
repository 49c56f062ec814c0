"""Which thread does a process's tensor work: one, always the same.

torch's CPU kernels run on OpenMP (GNU libgomp in the PyPI wheels). Every thread that runs a
parallel region gets its own team of worker threads, and the team stays for as long as that thread
lives. With two such threads in a process (the server's decode loop and the thread that loaded the
model, or backend-local's decode thread and the trainer), each parallel region paid for it on a
2-core machine, measured: a 1-row decode step took 55-60 ms on the decode thread while the loading
thread's idle team lived, against 35 ms with one team; a training forward and backward pass over 32
samples took 10-27% longer while another thread's idle team lived (three alternating pairs of
processes). So the rule: all tensor work of a process happens on one thread, and a thread that had
to do some elsewhere ends (its team ends with it). That includes one-off probes: a single
``scaled_dot_product_attention`` call on the caller's thread, made to see whether it takes
``enable_gqa``, gave that thread a team, and a decode step on the compute thread then took 58
instead of 31 ms (bf16, 16 rows) for the rest of the process.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["compute_executor", "in_passing_thread", "on_compute_thread"]

T = TypeVar("T")


@functools.cache
def compute_executor() -> concurrent.futures.ThreadPoolExecutor:
    """The thread that decodes and trains for backend-local's runs (one worker, for the whole process)."""
    return concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="reinforge-compute")


def _on_it() -> bool:
    return threading.current_thread().name.startswith("reinforge-compute")


def on_compute_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on :func:`compute_executor`'s thread (directly when already there); its result."""
    if _on_it():
        return fn(*args, **kwargs)
    return compute_executor().submit(fn, *args, **kwargs).result()


def in_passing_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on a new thread that ends when it returns (its OpenMP team ends too); its result.

    For tensor work that must happen before the thread that will do the rest exists (loading the served
    model before the decode loop starts). Exceptions propagate.
    """
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="reinforge-passing") as passing:
        return passing.submit(fn, *args, **kwargs).result()  # leaving the block ends the thread

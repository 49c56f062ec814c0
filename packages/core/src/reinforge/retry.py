"""The one retry loop for scoring calls (judges and group rewards): timeout, transient failures, permanent errors.

A transient failure (an exception, a timeout, ``TaskStatus.FAILED``) is
retried up to the budget and then reported, never turned into a reward; a
permanent error (any :class:`~reinforge.errors.ReinforgeError`: a
``ConfigurationError``, ``TaskStatus.ERROR``, a NaN or out-of-range reward) is
raised at once with the component's name in front.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .errors import ReinforgeError, attributed
from .outputs import TaskStatus

__all__ = ["Attempts", "call_with_retries"]


@dataclass
class Attempts:
    """What :func:`call_with_retries` returns: the output (None when every attempt failed) and why it failed."""

    output: Any = None
    error: str | None = None
    retries: int = 0


async def call_with_retries(
    call: Callable[[], Awaitable[Any]],
    check: Callable[[Any], Any],
    *,
    label: str,
    timeout_s: float,
    max_retries: int,
) -> Attempts:
    """Run ``call()`` up to ``1 + max_retries`` times until ``check(output)`` has ``status`` SUCCESS.

    :param call: makes one attempt (a fresh coroutine each time).
    :param check: validates and coerces the raw output (``BoundFunction.check_output``); it raises for a
        contract violation, which is permanent.
    :param label: ``"judge my_judge"``: the start of every message.
    """
    last = "no attempt"
    result = Attempts()
    for attempt in range(1 + max_retries):
        if attempt:
            result.retries += 1
        try:
            raw = await asyncio.wait_for(call(), timeout_s)
        except ReinforgeError as exc:  # permanent: retrying cannot help, and scoring on would train on nothing
            raise attributed(exc, label) from exc
        except asyncio.TimeoutError:
            last = f"{label} timed out after {timeout_s:g}s"
            continue
        except Exception as exc:  # transient: never a reward of 0
            last = f"{label} raised {type(exc).__name__}: {exc}"
            continue
        try:
            out = check(raw)
        except ReinforgeError as exc:
            raise attributed(exc, label) from exc
        if out.status is TaskStatus.SUCCESS:
            result.output = out
            return result
        last = f"{label} returned FAILED: {out.error}"
    result.error = last
    return result

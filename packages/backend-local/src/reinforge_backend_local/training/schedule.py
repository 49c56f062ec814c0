"""The learning-rate schedule of a run: a linear warm-up, then constant, linear or cosine decay.

Small models trained with a constant rate often stop exploring early; a warm-up keeps the first
updates (Adam's moments still empty) small, and a decay lets late steps refine rather than overshoot.
:func:`lr_factor` is the multiplier of ``algorithm.learning_rate`` at a step; the trainer sets
its optimizer's rate from it before each update (``Trainer.step(..., at_step=)``).
"""

from __future__ import annotations

import math

__all__ = ["LR_SCHEDULES", "lr_factor"]

LR_SCHEDULES = ("constant", "linear", "cosine")


def lr_factor(step: int, total: int, *, warmup: int = 0, schedule: str = "constant", min_ratio: float = 0.0) -> float:
    """The multiple of the base learning rate for update ``step`` (1-based) of ``total``.

    Warm-up: ``step / warmup`` for the first ``warmup`` steps (the last of them at the full rate).
    Then ``constant`` stays at 1; ``linear`` and ``cosine`` decay from 1 towards ``min_ratio``,
    which they reach at ``step == total`` (and keep after it, e.g. when resumed past the end).
    """
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"algorithm.lr_schedule must be one of {', '.join(LR_SCHEDULES)}, got {schedule!r}")
    if warmup > 0 and step <= warmup:
        return max(step, 1) / warmup
    if schedule == "constant":
        return 1.0
    span = max(total - warmup, 1)
    progress = min(max((step - warmup) / span, 0.0), 1.0)
    if schedule == "linear":
        shape = 1.0 - progress
    else:
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    return min_ratio + (1.0 - min_ratio) * shape

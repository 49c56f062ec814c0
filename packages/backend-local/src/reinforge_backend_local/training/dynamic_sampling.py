"""Dynamic sampling (DAPO): refill a step's batch with groups whose rewards differ.

For a group-relative algorithm a group whose rollouts all score the same gives no
gradient; as a policy gets good (or stays bad) on a prompt, more of each batch is such
dead groups and the step trains on fewer prompts. :func:`refill` samples further prompts,
as many as groups with signal are missing, until the batch holds ``batch_size`` of them
or ``max_rounds`` rounds of rollouts (the first included) have run. Every group sampled
stays in the result (the dead ones are skipped and counted by ``build_samples``), so
the step's reward metrics describe all the rollouts it made.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from reinforge.plugin import BatchResult, GroupResult

__all__ = ["refill"]


def refill(
    first: BatchResult,
    more: Callable[[int, int], BatchResult],
    *,
    batch_size: int,
    max_rounds: int,
    signal: Callable[[GroupResult], bool],
    summarize: Callable[[BatchResult], dict[str, float]],
) -> tuple[BatchResult, dict[str, float]]:
    """``first`` plus further rounds until ``batch_size`` groups carry signal or ``max_rounds`` have run.

    :param more: ``(prompts, round) -> BatchResult``: rollouts of that many new prompts (``round`` counts from 1).
    :param signal: whether a group trains (:func:`~.trainer.has_signal`).
    :param summarize: the runner's metrics of the merged batch (``Runner.summarize``).
    :returns: the merged batch and the ``dynamic_sampling/*`` metrics of the step.
    """
    groups = list(first.groups)
    counters: Counter = Counter(first.counters or {})
    seconds = first.seconds
    useful = sum(map(signal, groups))
    rounds = 1
    while useful < batch_size and rounds < max_rounds:
        extra = more(batch_size - useful, rounds)
        rounds += 1
        groups += extra.groups
        counters.update(extra.counters or {})
        seconds += extra.seconds
        useful += sum(map(signal, extra.groups))
    merged = BatchResult(groups, counters, {}, seconds)
    merged.metrics = summarize(merged)
    metrics = {
        "dynamic_sampling/rounds": float(rounds),
        "dynamic_sampling/prompts": float(len(groups)),
        "dynamic_sampling/groups_with_signal": float(useful),
    }
    return merged, metrics

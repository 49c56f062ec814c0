"""Advantages of the GRPO family, computed from the rewards of each group.

Each function takes one list of rewards per group and returns one list of
advantages per group. Groups whose rewards are all equal carry no signal for
group-relative methods; ``zero_variance`` finds them so the trainer can skip
and count them.
"""

from __future__ import annotations

import math
import statistics

from reinforge.config import ALGORITHMS
from reinforge.errors import ConfigError

EPS = 1e-6


def _std(values: list[float]) -> float:
    return statistics.pstdev(values) if len(values) > 1 else 0.0


def zero_variance(rewards: list[float]) -> bool:
    return max(rewards) - min(rewards) < EPS


def grpo(groups: list[list[float]], scale_rewards: str = "group") -> list[list[float]]:
    """(r - group mean), divided by the group's std, the batch's std, or nothing (Dr.GRPO)."""
    if scale_rewards not in ("group", "batch", "none"):
        raise ConfigError(f"algorithm.scale_rewards must be group, batch or none, got {scale_rewards!r}")
    centered = [[r - statistics.fmean(g) for r in g] for g in groups]
    if scale_rewards == "none":
        return centered
    if scale_rewards == "batch":
        std = _std([r for g in groups for r in g])
        return [[a / (std + EPS) for a in g] for g in centered]
    return [[a / (_std(g) + EPS) for a in c] for g, c in zip(groups, centered)]


def rloo(groups: list[list[float]]) -> list[list[float]]:
    """Leave-one-out baseline: r_i minus the mean of the other members' rewards."""
    out = []
    for g in groups:
        if len(g) < 2:
            raise ConfigError("rloo needs algorithm.group_size >= 2")
        total = sum(g)
        out.append([r - (total - r) / (len(g) - 1) for r in g])
    return out


def reinforce_pp(groups: list[list[float]]) -> list[list[float]]:
    """REINFORCE++ baseline: subtract the group mean, then normalize over the whole batch."""
    centered = [[r - statistics.fmean(g) for r in g] for g in groups]
    flat = [a for g in centered for a in g]
    mean, std = statistics.fmean(flat), _std(flat)
    return [[(a - mean) / (std + EPS) for a in g] for g in centered]


def advantages(algorithm: str, groups: list[list[float]], scale_rewards: str = "group") -> list[list[float]]:
    """Dispatch by ``algorithm.algorithm_type``; gspo and ppo use GRPO's advantages."""
    if algorithm in ("grpo", "multi_step_grpo", "gspo", "ppo"):
        out = grpo(groups, scale_rewards)
    elif algorithm == "rloo":
        out = rloo(groups)
    elif algorithm == "reinforce_pp":
        out = reinforce_pp(groups)
    else:
        raise ConfigError(f"algorithm.algorithm_type {algorithm!r} is not one of {', '.join(ALGORITHMS)}")
    for g in out:
        for a in g:
            if not math.isfinite(a):
                raise FloatingPointError(f"non-finite advantage from rewards {groups}")
    return out

"""The local backend's algorithms: their settings (the keys under ``algorithm:``) and their advantages.

Every algorithm shares one loss, PPO-clip against the generation-time
logprobs with an optional k3 KL term (:class:`LossSettings`); the GRPO-like
ones also choose how rewards are scaled (:class:`GroupSettings`). Core checks
a run's keys against :data:`ALGORITHMS` before any model loads.

Each advantage function takes one list of rewards per group and returns one
list of advantages per group. Groups whose rewards are all equal carry no
signal for group-relative methods; ``zero_variance`` finds them so the
trainer can skip and count them.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from reinforge.plugin import ConfigError, Settings, at_least, finite, one_of

__all__ = [
    "ALGORITHMS",
    "ALGORITHM_ALIASES",
    "GroupSettings",
    "LossSettings",
    "MultiStepSettings",
    "advantages",
    "call_advantages",
    "resolve",
    "zero_variance",
]

EPS = 1e-6


@dataclass
class LossSettings(Settings):
    """The policy loss every algorithm of the local backend uses."""

    kl_coef: float = 0.0  # k3 KL to the base model (0: no reference forward)
    clip_range: float = 0.2  # PPO clip: ratio within [1 - clip_range, 1 + clip_range_high]
    clip_range_high: float | None = None  # default: clip_range
    loss_agg_mode: str = "token-mean"  # token-mean or sequence-mean
    ppo_epochs: int = 1  # passes over each batch
    max_grad_norm: float = 1.0  # gradient clipping

    def check(self) -> None:
        at_least("kl_coef", self.kl_coef, 0.0)
        finite("kl_coef", self.kl_coef)
        at_least("clip_range", self.clip_range, 0.0, strict=True)
        finite("clip_range", self.clip_range)
        at_least("clip_range_high", self.clip_range_high, 0.0, strict=True)
        finite("clip_range_high", self.clip_range_high)
        one_of("loss_agg_mode", self.loss_agg_mode, ("token-mean", "sequence-mean"))
        at_least("ppo_epochs", self.ppo_epochs, 1)
        at_least("max_grad_norm", self.max_grad_norm, 0.0, strict=True)
        finite("max_grad_norm", self.max_grad_norm)

    @property
    def scale(self) -> str:
        """How rewards are scaled into advantages (only the GRPO-like algorithms choose)."""
        return "group"


@dataclass
class GroupSettings(LossSettings):
    """GRPO, multi-step GRPO, GSPO and PPO: group-mean baseline, then a choice of scaling."""

    scale_rewards: str = "group"  # divide by the group's std, the batch's std, or none (Dr.GRPO)

    def check(self) -> None:
        super().check()
        one_of("scale_rewards", self.scale_rewards, ("group", "batch", "none"))

    @property
    def scale(self) -> str:
        return self.scale_rewards


@dataclass
class MultiStepSettings(GroupSettings):
    """Multi-step GRPO: the trajectory's advantage on every model call, plus each call's own reward.

    A workflow may reward single calls (``WorkflowOutput.call_rewards``: a
    well-formed tool call, a failed one). Those rewards are made group-relative
    among the calls of the group that carry one (minus their mean, scaled as
    ``scale_rewards`` says) and, times ``call_reward_weight``, added to the
    advantage of that call alone; calls without one get the trajectory's advantage only.
    """

    call_reward_weight: float = 1.0

    def check(self) -> None:
        super().check()
        at_least("call_reward_weight", self.call_reward_weight, 0.0)
        finite("call_reward_weight", self.call_reward_weight)


ALGORITHMS: dict[str, type[LossSettings]] = {
    "grpo": GroupSettings,
    "multi_step_grpo": MultiStepSettings,  # the trajectory's advantage on every model call, plus call rewards
    "rloo": LossSettings,  # leave-one-out baseline
    "reinforce_pp": LossSettings,  # group-mean baseline, normalized over the batch
    "gspo": GroupSettings,  # one (geometric-mean) ratio per sequence
    "ppo": GroupSettings,  # GRPO's advantages, several epochs per batch (no critic)
}
ALGORITHM_ALIASES = {"reinforce++": "reinforce_pp", "reinforce_plus_plus": "reinforce_pp"}


def resolve(algo: Any, settings: LossSettings | None = None, name: str | None = None) -> tuple[str, LossSettings]:
    """The canonical algorithm name and its loss settings, for a core ``AlgorithmConfig``.

    A backend run passes ``job.algorithm_name`` and ``job.algorithm_settings``
    (checked by core); code that builds a :class:`~reinforge_backend_local.trainer.Trainer`
    directly passes only the ``AlgorithmConfig`` and its keys are checked here.
    """
    if name is None or settings is None:
        from .backend import LocalBackend

        backend = LocalBackend()
        name = name or backend.algorithm_name(algo, where="algorithm")
        if settings is None:
            settings = backend.check_algorithm(algo, where="algorithm") or ALGORITHMS[name]()
    return name, settings


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


def call_advantages(groups: list[list[float]], scale_rewards: str = "group", weight: float = 1.0) -> list[list[float]]:
    """Per-call advantages from the call rewards of each group (the calls that carry one).

    ``weight * (r - group mean)``, divided by the group's std, the batch's std,
    or nothing, as for trajectory rewards. A group with one rewarded call or
    equal call rewards gets zeros.
    """
    out = []
    flat = [r for g in groups for r in g]
    batch_std = _std(flat)
    for g in groups:
        if len(g) < 2 or zero_variance(g):
            out.append([0.0] * len(g))
            continue
        mean = statistics.fmean(g)
        scale = {"group": _std(g) + EPS, "batch": batch_std + EPS, "none": 1.0}[scale_rewards]
        out.append([weight * (r - mean) / scale for r in g])
    return out


def advantages(algorithm: str, groups: list[list[float]], scale_rewards: str = "group") -> list[list[float]]:
    """Dispatch by the canonical algorithm name; gspo and ppo use GRPO's advantages."""
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

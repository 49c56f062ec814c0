"""The local backend's algorithms: one :class:`Algorithm` record per name, in :data:`ALGORITHMS`.

A record says everything the backend knows about an algorithm: the settings of its
loss (the keys under ``algorithm:``, :class:`LossSettings` and its subclasses), its
advantage function, and the flags the trainer reads (group-relative, sequence-level
ratio, per-call weighting, call rewards). Core's validation reads the settings classes
(``LocalBackend.algorithms``) and the trainer reads the same record: no name is
checked anywhere else.

Every algorithm shares one loss, PPO-clip against the generation-time logprobs with
an optional k3 KL term; the GRPO-like ones also choose how rewards are scaled
(:class:`GroupSettings`). Each advantage function takes one list of rewards per
group and the scaling, and returns one list of advantages per group. Groups whose
rewards are all equal carry no signal for group-relative methods;
:func:`zero_variance` finds them so the trainer can skip and count them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from reinforge.plugin import ConfigError, Settings, at_least, finite, in_range, one_of

from .schedule import LR_SCHEDULES

__all__ = [
    "ALGORITHMS",
    "ALGORITHM_ALIASES",
    "Algorithm",
    "GroupSettings",
    "LossSettings",
    "MultiStepSettings",
    "SamplingSettings",
    "advantages",
    "algorithm",
    "call_advantages",
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
    entropy_coef: float = 0.0  # loss - entropy_coef * mean token entropy (0: no entropy term)
    lr_warmup_steps: int = 0  # learning rate ramps up linearly over these steps (training/schedule.py)
    lr_schedule: str = "constant"  # after warm-up: constant, linear or cosine decay to lr_min_ratio x at total_steps
    lr_min_ratio: float = 0.0  # where linear and cosine decay end, as a fraction of learning_rate

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
        at_least("entropy_coef", self.entropy_coef, 0.0)
        finite("entropy_coef", self.entropy_coef)
        at_least("lr_warmup_steps", self.lr_warmup_steps, 0)
        one_of("lr_schedule", self.lr_schedule, LR_SCHEDULES)
        in_range("lr_min_ratio", self.lr_min_ratio, 0.0, 1.0)

    @property
    def scale(self) -> str:
        """How rewards are scaled into advantages (only the GRPO-like algorithms choose)."""
        return "group"

    @property
    def lr_scheduled(self) -> bool:
        """Whether the learning rate changes from step to step (else the optimizer's rate is left alone)."""
        return self.lr_warmup_steps > 0 or self.lr_schedule != "constant"


@dataclass
class SamplingSettings(LossSettings):
    """Group-relative algorithms: optionally refill the batch with groups that carry signal (DAPO).

    A group whose rewards are all equal gives no gradient. With ``dynamic_sampling``
    each step samples further prompts (as many as groups are missing) and keeps the
    groups whose rewards differ, until the batch holds ``batch_size`` of them or
    ``max_sampling_rounds`` rounds of rollouts (the first included) have run.
    """

    dynamic_sampling: bool = False
    max_sampling_rounds: int = 3

    def check(self) -> None:
        super().check()
        at_least("max_sampling_rounds", self.max_sampling_rounds, 1)


@dataclass
class GroupSettings(SamplingSettings):
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


def rloo(groups: list[list[float]], scale_rewards: str = "group") -> list[list[float]]:
    """Leave-one-out baseline: r_i minus the mean of the other members' rewards (no scaling to choose)."""
    out = []
    for g in groups:
        if len(g) < 2:
            raise ConfigError("rloo needs algorithm.group_size >= 2")
        total = sum(g)
        out.append([r - (total - r) / (len(g) - 1) for r in g])
    return out


def reinforce_pp(groups: list[list[float]], scale_rewards: str = "group") -> list[list[float]]:
    """REINFORCE++ baseline: subtract the group mean, then normalize over the whole batch (no scaling to choose)."""
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


def advantages(algorithm: Algorithm, groups: list[list[float]], scale_rewards: str = "group") -> list[list[float]]:
    """``algorithm``'s advantages for ``groups``; a non-finite one is an error (a reward was inf or nan)."""
    out = algorithm.advantages(groups, scale_rewards)
    for g in out:
        for a in g:
            if not math.isfinite(a):
                raise FloatingPointError(f"non-finite advantage from rewards {groups}")
    return out


@dataclass(frozen=True)
class Algorithm:
    """One algorithm of the local backend: its settings, its advantages and how the trainer treats it.

    :ivar name: the canonical ``algorithm_type``.
    :ivar settings: the settings class of the keys under ``algorithm:`` (checked by core before any model loads).
    :ivar advantages: ``(groups of rewards, scale_rewards) -> groups of advantages``.
    :ivar group_relative: a group whose rewards are all equal carries no signal: skipped and counted.
    :ivar sequence_ratio: one PPO ratio per sequence, the geometric mean of its token ratios (GSPO).
    :ivar per_call_weight: each call of a trajectory weighs ``1 / calls``, so long episodes do not dominate.
    :ivar call_rewards: a call's own reward adds its group-relative call advantage
        (``settings.call_reward_weight`` times, :func:`call_advantages`).
    """

    name: str
    settings: type[LossSettings]
    advantages: Callable[[list[list[float]], str], list[list[float]]]
    group_relative: bool = True
    sequence_ratio: bool = False
    per_call_weight: bool = False
    call_rewards: bool = False


ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        Algorithm("grpo", GroupSettings, grpo),
        # the trajectory's advantage on every model call, plus call rewards
        Algorithm("multi_step_grpo", MultiStepSettings, grpo, per_call_weight=True, call_rewards=True),
        Algorithm("rloo", SamplingSettings, rloo),  # leave-one-out baseline
        # group-mean baseline, normalized over the batch: equal rewards in a group still train against the batch
        Algorithm("reinforce_pp", LossSettings, reinforce_pp, group_relative=False),
        Algorithm("gspo", GroupSettings, grpo, sequence_ratio=True),  # one (geometric-mean) ratio per sequence
        Algorithm("ppo", GroupSettings, grpo),  # GRPO's advantages, several epochs per batch (no critic)
    )
}
ALGORITHM_ALIASES = {"reinforce++": "reinforce_pp", "reinforce_plus_plus": "reinforce_pp"}


def algorithm(name: str) -> Algorithm:
    """The record of ``name`` (an alias resolved), for code that builds a trainer without a run file."""
    found = ALGORITHMS.get(ALGORITHM_ALIASES.get(name, name))
    if found is None:
        raise ConfigError(f"algorithm.algorithm_type {name!r} is not one of {', '.join(ALGORITHMS)}")
    return found

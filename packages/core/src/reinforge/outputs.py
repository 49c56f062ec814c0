"""What user functions return: the AgentScope-tuner compatible output types."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any


class TaskStatus(str, enum.Enum):
    """Outcome of one function call.

    ``FAILED`` means "transient, not the model's fault" (a judge timed out, a
    service returned 503): the runner retries and, if it keeps failing,
    discards the sample. ``ERROR`` means "permanent: retrying cannot help" (a
    judge's configuration is wrong): the run stops with the component's name
    and ``error``. A wrong answer is ``SUCCESS`` with reward 0.
    """

    SUCCESS = "success"
    FAILED = "failed"
    ERROR = "error"


def _check_number(owner: str, name: str, value: Any) -> float:
    from .errors import RewardError

    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, (int, float)):
        raise RewardError(f"{owner}.{name} must be a number, got {type(value).__name__}: {value!r}")
    value = float(value)
    if math.isnan(value) or math.isinf(value):
        raise RewardError(f"{owner}.{name} must be finite, got {value}")
    return value


@dataclass
class WorkflowOutput:
    """Result of running the agent on one task.

    A ``reward`` set here skips the judges (the workflow scored itself, e.g.
    from environment feedback). ``call_rewards`` gives some model calls a
    reward of their own (a well-formed tool call, a failed one), one entry per
    call the rollout made, in order, ``None`` for a call without one; the
    runner puts each on its :class:`~reinforge.ModelCall` (``call.reward``)
    and an algorithm that credits turns (backend-local's ``multi_step_grpo``)
    adds it to that call's advantage only.
    """

    response: Any = None
    reward: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    status: TaskStatus = TaskStatus.SUCCESS
    error: str | None = None
    call_rewards: list[float | None] | None = None

    def __post_init__(self) -> None:
        self.status = TaskStatus(self.status)
        if self.reward is not None:
            self.reward = _check_number("WorkflowOutput", "reward", self.reward)
        if self.call_rewards is not None:
            self.call_rewards = [
                None if r is None else _check_number("WorkflowOutput", f"call_rewards[{i}]", r)
                for i, r in enumerate(self.call_rewards)
            ]


@dataclass
class JudgeOutput:
    """Score of one response. ``metrics`` are reported as sub-dimensions."""

    reward: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    status: TaskStatus = TaskStatus.SUCCESS
    error: str | None = None

    def __post_init__(self) -> None:
        self.status = TaskStatus(self.status)
        if self.status is TaskStatus.SUCCESS:
            if self.reward is None:
                raise ValueError("JudgeOutput.reward is required when status is SUCCESS")
            self.reward = _check_number("JudgeOutput", "reward", self.reward)


@dataclass
class GroupRewardOutput:
    """Rewards for every response of one task, in the order they were given."""

    rewards: list[float] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    status: TaskStatus = TaskStatus.SUCCESS
    error: str | None = None

    def __post_init__(self) -> None:
        self.status = TaskStatus(self.status)
        if self.status is TaskStatus.SUCCESS:
            self.rewards = [_check_number("GroupRewardOutput", f"rewards[{i}]", r) for i, r in enumerate(self.rewards)]

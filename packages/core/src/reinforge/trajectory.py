"""A trajectory: one run of the workflow on one task, with everything RL needs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .models import ModelCall
from .outputs import TaskStatus


@dataclass
class Trajectory:
    """One rollout.

    ``rewards`` holds every reward dimension under its stable metric name
    (``reward/<judge>``, ``reward/<judge>/<sub>``); ``reward`` is the composed
    scalar the algorithm trains on.
    """

    task: dict[str, Any]
    task_index: int = 0
    rollout_index: int = 0
    group_id: str = ""
    calls: list[ModelCall] = field(default_factory=list)
    response: Any = None
    reward: float | None = None
    rewards: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    status: TaskStatus = TaskStatus.SUCCESS
    error: str | None = None
    attempts: int = 0
    timed_out: bool = False
    seconds: float = 0.0
    judge_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status is TaskStatus.SUCCESS and self.reward is not None

    @property
    def truncated(self) -> bool:
        return bool(self.calls) and self.calls[-1].response.truncated

    def reset(self) -> None:
        """Forget a failed attempt before it is retried."""
        self.calls.clear()
        self.response = None
        self.reward = None
        self.rewards.clear()
        self.metrics.clear()
        self.status = TaskStatus.SUCCESS
        self.error = None
        self.timed_out = False

    def to_dict(self) -> dict[str, Any]:
        from .text import response_text

        return {
            "task": self.task,
            "task_index": self.task_index,
            "rollout_index": self.rollout_index,
            "group_id": self.group_id,
            "response": response_text(self.response),
            "reward": self.reward,
            "rewards": self.rewards,
            "metrics": self.metrics,
            "status": self.status.value,
            "error": self.error,
            "attempts": self.attempts,
            "timed_out": self.timed_out,
            "seconds": self.seconds,
            "calls": [c.to_dict() for c in self.calls],
        }

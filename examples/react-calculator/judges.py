"""Judges of the ReAct calculator example; correctness uses core's built-in ``last_number``.

The ``react`` workflow's response is the whole episode (a ``ReActResult``):
its text is the final answer, and ``steps``/``metrics`` tell what the agent
did. A plain string response (``reinforge try judge``) has no steps, so it
counts as "no tool used".
"""

from __future__ import annotations

from typing import Any

from reinforge import JudgeOutput


def _successful_calls(response: Any, tool: str) -> int:
    steps = getattr(response, "steps", None) or []
    return sum(1 for s in steps if getattr(s, "kind", None) == "tool" and getattr(s, "tool", None) == tool)


async def used_tool_when_needed(task: dict, response: Any, tool: str = "calculator") -> JudgeOutput:
    """1 when a question that needs the tool got at least one successful call of it.

    Questions marked ``needs_tool: false`` score 1 either way: a call is only slower, not wrong.
    """
    calls = _successful_calls(response, tool)
    needed = bool(task.get("needs_tool", True))
    reward = float(calls > 0) if needed else 1.0
    return JudgeOutput(reward=reward, metrics={"tool_calls": float(calls), "needed": float(needed)})


async def clean_protocol(task: dict, response: Any) -> JudgeOutput:
    """The share of turns without an invalid action, 0 when the episode ended without a final answer."""
    metrics = getattr(response, "metrics", None) or {}
    turns = metrics.get("turns") or 1.0
    invalid = metrics.get("invalid_action_count", 0.0)
    answered = getattr(response, "final_answer", None) is not None or isinstance(response, str)
    reward = max(0.0, 1.0 - invalid / turns) if answered else 0.0
    return JudgeOutput(reward=reward, metrics={"invalid_rate": invalid / turns})

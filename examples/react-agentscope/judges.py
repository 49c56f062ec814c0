"""Judges of the AgentScope calculator example; correctness is core's built-in ``last_number``.

The workflow's response is the agent's reply, an AgentScope ``Msg``: its text is the
final answer and ``metadata["calculator_calls"]`` lists the tool calls the agent made
(``{"expression", "output", "ok"}``). A plain string (``reinforge try judge``) made none.

The run file gates every reward on a correct answer, so the tool-use credit below is
paid only alongside a right answer: calling the calculator with anything, or calling it
and then answering something else, earns nothing.
"""

from __future__ import annotations

from typing import Any

from reinforge import JudgeOutput


def calculator_calls(response: Any) -> list[dict[str, Any]]:
    """The tool calls recorded on a reply ``Msg`` (none for a string or a reply without them)."""
    metadata = getattr(response, "metadata", None)
    if isinstance(response, dict):
        metadata = response.get("metadata")
    calls = metadata.get("calculator_calls") if isinstance(metadata, dict) else None
    return [c for c in calls or [] if isinstance(c, dict)]


def _same_number(output: Any, answer: Any) -> bool:
    try:
        return float(str(output).replace(",", "").strip()) == float(str(answer).replace(",", "").strip())
    except ValueError:
        return False


async def used_calculator(task: dict, response: Any, answer_field: str = "answer") -> JudgeOutput:
    """1 when a question that needs the tool got a successful calculator call that produced the answer.

    A call whose result is not ``task["answer"]`` (a wrong expression) does not count, nor one whose
    expression is the answer itself (``{"expression": "17248"}`` computes nothing).
    Questions marked ``needs_tool: false`` score 1 either way: a call there is only slower, not wrong.
    """
    calls = calculator_calls(response)
    answer = task.get(answer_field)
    # a call counts when it computed the answer: not a failed one, and not the answer itself passed in
    right = any(
        c.get("ok") and _same_number(c.get("output"), answer) and not _same_number(c.get("expression"), answer)
        for c in calls
    )
    needed = bool(task.get("needs_tool", True))
    reward = float(right) if needed else 1.0
    return JudgeOutput(
        reward=reward,
        metrics={"calls": float(len(calls)), "right_call": float(right), "needed": float(needed)},
    )

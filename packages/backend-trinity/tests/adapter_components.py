"""Workflows, judges and a group reward for the adapter tests, referenced from a run file as ``adapter_components:NAME``.

The test copies this file next to its run file, so the references resolve the way a user's own module does
(relative to the run file's folder), on Trinity's side, by path.
"""

from __future__ import annotations

from typing import Any

from reinforge import ChatModel, GroupRewardOutput, JudgeOutput, TaskStatus, WorkflowOutput

SYSTEM = "You are a careful calculator. Reply with just the number."
FOLLOW_UP = "Are you sure? Reply with just the number again."


def text_of(response: Any) -> str:
    return response.content if hasattr(response, "content") else str(response)


async def one_turn(task: dict, model: ChatModel) -> WorkflowOutput:
    """One question, one model call."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task["question"]}]
    return WorkflowOutput(response=await model.chat(messages), metrics={"calls": 1.0})


async def two_turns(task: dict, model: ChatModel) -> WorkflowOutput:
    """The question, the model's answer, a follow-up: two model calls, the second sees the first."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task["question"]}]
    first = await model.chat(messages)
    messages += [{"role": "assistant", "content": first.content}, {"role": "user", "content": FOLLOW_UP}]
    return WorkflowOutput(response=await model.chat(messages), metrics={"calls": 2.0})


async def two_turns_first_rewarded(task: dict, model: ChatModel) -> WorkflowOutput:
    """Two calls; the workflow rewards the first itself (0.25), the second gets the run's reward from the judges."""
    out = await two_turns(task, model)
    out.call_rewards = [0.25, None]
    return out


def length_score(text: str) -> float:
    """What :func:`length_judge` gives a reply (the tests recompute it from the decoded tokens)."""
    return round(len(text.strip()) / 100.0, 6)


async def length_judge(task: dict, response: Any) -> JudgeOutput:
    """A deterministic score of the reply's text, so a test can recompute it from the experience's tokens."""
    return JudgeOutput(reward=length_score(text_of(response)), metrics={"chars": float(len(text_of(response)))})


async def longest_wins(task: dict, responses: list[Any]) -> GroupRewardOutput:
    """1 for the longest reply(s) of the group, 0 for the rest: needs every repeat at once."""
    lengths = [len(text_of(r).strip()) for r in responses]
    return GroupRewardOutput(rewards=[1.0 if n == max(lengths) else 0.0 for n in lengths])


class FailsFirstCall:
    """A judge that reports FAILED (transient) on its first call of the run, then scores like length_judge.

    A class: core builds it once per run, so the count lives exactly as long as the run's components.
    """

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, task: dict, response: Any) -> JudgeOutput:
        self.calls += 1
        if self.calls == 1:
            return JudgeOutput(status=TaskStatus.FAILED, error="the judge's service said 503")
        return JudgeOutput(reward=length_score(text_of(response)))


async def always_fails(task: dict, response: Any) -> JudgeOutput:
    return JudgeOutput(status=TaskStatus.FAILED, error="the judge's service is down")

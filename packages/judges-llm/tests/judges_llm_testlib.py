"""A scripted judge model for the tests: reads the judges' prompts and answers by a behaviour.

It runs behind ``reinforge.testing.OpenAIServer`` (a real HTTP server on
127.0.0.1), so every verdict travels through LiteLLM like a real one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

TASK = re.compile(r"<task>\n(.*?)\n</task>", re.DOTALL)
REFERENCE = re.compile(r"<reference>\n(.*?)\n</reference>", re.DOTALL)
SINGLE = re.compile(r"<response>\n(.*?)\n</response>", re.DOTALL)
PAIR_A = re.compile(r"<response_a>\n(.*?)\n</response_a>", re.DOTALL)
PAIR_B = re.compile(r"<response_b>\n(.*?)\n</response_b>", re.DOTALL)
LISTED = re.compile(r'<response id="(\d+)">\n(.*?)\n</response>', re.DOTALL)
QUALITY = re.compile(r"quality=(\d+)")


def quality(text: str) -> int:
    """The true quality a test wrote into a response as ``quality=N``."""
    match = QUALITY.search(text)
    if match is None:
        raise ValueError(f"no quality=N in {text[:80]!r}")
    return int(match.group(1))


class JudgeScript:
    """Responder: ``pointwise(task, response, reference) -> int``, ``pairwise(task, a, b) -> "A"|"B"|"tie"``,
    ``listwise(task, [texts]) -> [int]``. Each may return a str, which is sent as the raw reply."""

    def __init__(
        self,
        pointwise: Callable[..., Any] | None = None,
        pairwise: Callable[..., Any] | None = None,
        listwise: Callable[..., Any] | None = None,
    ):
        self.pointwise = pointwise
        self.pairwise = pairwise
        self.listwise = listwise
        self.seen: list[str] = []

    def __call__(self, body: dict[str, Any]) -> Any:
        user = body["messages"][-1]["content"]
        task_match = TASK.search(user)
        task = task_match.group(1) if task_match else ""
        ref = REFERENCE.search(user)
        reference = ref.group(1) if ref else None
        if PAIR_A.search(user):
            a, b = PAIR_A.search(user).group(1), PAIR_B.search(user).group(1)
            self.seen.append("pairwise")
            out = self.pairwise(task, a, b)
            return out if out not in ("A", "B", "tie") else json.dumps({"reason": "compared", "winner": out})
        listed = LISTED.findall(user)
        if listed:
            self.seen.append("listwise")
            texts = [text for _, text in sorted(listed, key=lambda item: int(item[0]))]
            out = self.listwise(task, texts)
            if isinstance(out, str):
                return out
            return json.dumps({"scores": [{"id": i, "reason": "ok", "score": s} for i, s in enumerate(out, 1)]})
        self.seen.append("pointwise")
        out = self.pointwise(task, SINGLE.search(user).group(1), reference)
        return out if isinstance(out, str) else json.dumps({"reason": "graded", "score": out})


def verdict(score: int, reason: str = "graded") -> str:
    return json.dumps({"reason": reason, "score": score})


# The scripted judge's scores (1-5) for the responses of data/gold.jsonl; the human labels are in the file.
# Hand-checked agreement (see test_calibrate.py): rho = 34.5 / sqrt(40.5 * 39.5), tau-b = 19 / sqrt(600), kappa = 5/13.
GOLD_JUDGE_SCORES = {
    "Sydney.": 1,
    "12 is a prime number.": 3,
    "Merci beaucoup, or 'grâce'.": 2,
    "HyperText Transfer Protocol; it is used to send email.": 3,
    "The meeting is now on Friday.": 3,
    "144.": 5,
    "Jane Austen; it was published in 1813.": 4,
    "100 degrees Celsius.": 5,
}


def gold_score(task: str, response: str, reference: str | None) -> int:
    return GOLD_JUDGE_SCORES[response]


def inverted_gold_score(task: str, response: str, reference: str | None) -> int:
    return 6 - GOLD_JUDGE_SCORES[response]


async def table_judge(task: dict, response: object):
    """A plain Python judge (no model) with the same scores, to calibrate a module:attr reference."""
    from reinforge import JudgeOutput, response_text

    return JudgeOutput(reward=(GOLD_JUDGE_SCORES[response_text(response)] - 1) / 4)


def inverted_table_judge(task: dict, response: object) -> float:
    from reinforge import response_text

    return (5 - GOLD_JUDGE_SCORES[response_text(response)]) / 4

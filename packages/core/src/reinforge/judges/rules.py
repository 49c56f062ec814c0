"""Rule judges: cheap, deterministic, no model call.

Each reads the reference from ``task[field]``; a task without that field is a
data error naming the judge and the field, not a reward of 0.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from ..errors import RewardError
from ..outputs import JudgeOutput
from ..text import response_text

_NUMBER = re.compile(r"[-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def _reference(task: dict, field: str, judge: str) -> Any:
    if field not in task:
        raise RewardError(
            f"judge {judge!r} reads task[{field!r}], but the task has only {sorted(task)}; set args.field"
        )
    return task[field]


def _norm(text: str, ignore_case: bool, strip: bool) -> str:
    if strip:
        text = " ".join(text.split())
    return text.lower() if ignore_case else text


def parse_number(text: str) -> float | None:
    """A number written like ``1,234.5`` or ``-3``; None when it is not one."""
    try:
        return float(text.replace(",", "").strip())
    except ValueError:
        return None


def numbers_in(text: str) -> list[float]:
    out = []
    for match in _NUMBER.findall(text):
        value = parse_number(match.rstrip("."))
        if value is not None:
            out.append(value)
    return out


def _close(a: float, b: float, tolerance: float) -> bool:
    return math.isclose(a, b, rel_tol=tolerance, abs_tol=tolerance)


def exact_match(
    task: dict, response: Any, field: str = "answer", ignore_case: bool = True, strip: bool = True
) -> JudgeOutput:
    """1 when the response equals the reference (whitespace and case normalized by default)."""
    ref = str(_reference(task, field, "exact_match"))
    return JudgeOutput(
        reward=float(_norm(response_text(response), ignore_case, strip) == _norm(ref, ignore_case, strip))
    )


def contains(task: dict, response: Any, field: str = "answer", ignore_case: bool = True) -> JudgeOutput:
    """1 when the reference appears anywhere in the response."""
    ref = str(_reference(task, field, "contains"))
    text = response_text(response)
    if ignore_case:
        ref, text = ref.lower(), text.lower()
    return JudgeOutput(reward=float(ref in text))


def last_number(task: dict, response: Any, field: str = "answer", tolerance: float = 1e-6) -> JudgeOutput:
    """1 when the last number in the response equals the reference numerically."""
    ref = parse_number(str(_reference(task, field, "last_number")))
    if ref is None:
        raise RewardError(f"judge 'last_number': task[{field!r}] = {task[field]!r} is not a number")
    found = numbers_in(response_text(response))
    return JudgeOutput(reward=float(bool(found) and _close(found[-1], ref, tolerance)))


def numeric_equal(task: dict, response: Any, field: str = "answer", tolerance: float = 1e-6) -> JudgeOutput:
    """1 when the whole response is a number equal to the reference (stricter than last_number)."""
    ref = parse_number(str(_reference(task, field, "numeric_equal")))
    if ref is None:
        raise RewardError(f"judge 'numeric_equal': task[{field!r}] = {task[field]!r} is not a number")
    value = parse_number(response_text(response).strip().rstrip("."))
    return JudgeOutput(reward=float(value is not None and _close(value, ref, tolerance)))


def regex(
    task: dict, response: Any, pattern: str = "", fullmatch: bool = False, ignore_case: bool = False
) -> JudgeOutput:
    """1 when ``pattern`` matches the response (anywhere, or the whole of it)."""
    if not pattern:
        raise RewardError("judge 'regex' needs args.pattern")
    flags = re.IGNORECASE if ignore_case else 0
    text = response_text(response)
    found = re.fullmatch(pattern, text.strip(), flags) if fullmatch else re.search(pattern, text, flags)
    return JudgeOutput(reward=float(found is not None))


def json_valid(task: dict, response: Any, required_keys: list[str] | None = None) -> JudgeOutput:
    """1 when the response is a JSON object/array (with ``required_keys`` when given)."""
    text = response_text(response).strip()
    if text.startswith("```"):
        text = text.strip("`").removeprefix("json").strip()
    try:
        value = json.loads(text)
    except ValueError:
        return JudgeOutput(reward=0.0, metrics={"parsed": 0.0})
    keys = list(required_keys or [])
    has = all(k in value for k in keys) if isinstance(value, dict) else not keys
    return JudgeOutput(reward=float(has), metrics={"parsed": 1.0})


def length_penalty(task: dict, response: Any, target: int = 200, limit: int = 800, unit: str = "chars") -> JudgeOutput:
    """1 up to ``target``, falling linearly to 0 at ``limit`` (chars or words).

    A decay rather than a cliff, so the model is not pushed to the limit.
    """
    if unit not in ("chars", "words"):
        raise RewardError(f"judge 'length_penalty': unit must be 'chars' or 'words', got {unit!r}")
    if limit <= target:
        raise RewardError(f"judge 'length_penalty': limit ({limit}) must be greater than target ({target})")
    text = response_text(response)
    n = len(text.split()) if unit == "words" else len(text)
    reward = 1.0 if n <= target else max(0.0, 1.0 - (n - target) / (limit - target))
    return JudgeOutput(reward=reward, metrics={"length": float(n)})


RULE_JUDGES = {
    "exact_match": exact_match,
    "contains": contains,
    "last_number": last_number,
    "numeric_equal": numeric_equal,
    "regex": regex,
    "json_valid": json_valid,
    "length_penalty": length_penalty,
}

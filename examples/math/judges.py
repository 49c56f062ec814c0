"""Judges of the math example. Correctness and conciseness use core's built-in rules."""

from __future__ import annotations

import re
from typing import Any

from reinforge import ChatModel, JudgeOutput

_JUST_A_NUMBER = re.compile(r"-?\d+(\.\d+)?\.?")


async def just_the_number(
    task: dict,
    response: Any,
    auxiliary_models: dict[str, ChatModel] | None = None,
) -> JudgeOutput:
    """1 when the reply is a bare number, as the system prompt asks; right or wrong."""
    text = response.get_text_content() if hasattr(response, "get_text_content") else str(response)
    return JudgeOutput(reward=float(bool(_JUST_A_NUMBER.fullmatch(text.strip()))))

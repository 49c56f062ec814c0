"""A tolerant parser of text actions, for models that cannot emit native tool calls.

Two shapes are read, whatever format the prompt asked for:

- ReAct lines: ``Thought: ...``, ``Action: <tool>``, ``Action Input: <json or text>``,
  ``Final Answer: ...`` (any case, markdown bold around the markers allowed,
  ``Action: tool[input]`` and ``Action: tool(input)`` too);
- a JSON action block, fenced or bare: ``{"action": "<tool>", "action_input": {...}}``
  (also ``tool``/``name`` with ``arguments``/``args``/``input``/``parameters``),
  ``{"final_answer": "..."}`` or ``{"action": "Final Answer", "action_input": "..."}``.

Whatever the model wrote after a hallucinated ``Observation:`` is ignored.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["ParsedAction", "parse_action", "parse_input"]

_B = r"[*_#\s]*"  # markdown around markers: **Action:**, ### Final Answer
_OBSERVATION = re.compile(rf"(?im)^{_B}observation{_B}:")
_FINAL = re.compile(rf"(?i)(?:^|(?<=\s)|(?<=\*))final[\s_]*answer{_B}:[*_]*")
_ACTION = re.compile(rf"(?i)(?:^|(?<=\s)|(?<=\*))action(?:\s*\d+)?{_B}:[*_]*")
_ACTION_INPUT = re.compile(rf"(?i)(?:^|(?<=\s)|(?<=\*))action[\s_]*input(?:\s*\d+)?{_B}:[*_]*")
_THOUGHT = re.compile(rf"(?i)(?:^|(?<=\s)|(?<=\*))thought(?:\s*\d+)?{_B}:[*_]*")
_NEXT_MARKER = re.compile(rf"(?im)^{_B}(?:thought|observation|final[\s_]*answer|action)\b")
_FENCE = re.compile(r"```[A-Za-z]*\s*(.*?)```", re.S)
_BRACKET_CALL = re.compile(r"^([A-Za-z0-9_.-]+)\s*[\[(](.*)[\])]\s*$", re.S)
# {"expression": 616 * 28}: one key whose value lost its quotes (small models drop them)
_LOOSE_OBJECT = re.compile(r"""^\{\s*(["']?)([A-Za-z_][A-Za-z0-9_]*)\1\s*:\s*([^"'{}]+?)\s*\}$""", re.S)

_TOOL_KEYS = ("action", "tool", "tool_name", "name", "function")
_INPUT_KEYS = ("action_input", "arguments", "args", "input", "parameters", "tool_input")
_FINAL_KEYS = ("final_answer", "answer", "final")
_FINAL_NAMES = {"final answer", "final_answer", "finalanswer", "finish", "answer"}


@dataclass
class ParsedAction:
    """What one model reply asks for.

    ``kind`` is ``"tool"`` (call ``tool`` with ``tool_input``), ``"final"``
    (``answer``), ``"invalid"`` (``error`` says why; the model is told) or
    ``"none"`` (plain text with no action and no final-answer marker).
    """

    kind: str
    thought: str = ""
    tool: str | None = None
    tool_input: Any = None
    answer: str | None = None
    error: str | None = None


def _clean_name(raw: str) -> str:
    return raw.strip().strip("`'\"*_[]()<>{}").strip().rstrip(".:,;").strip("`'\"*_ ")


def _strip_fence(text: str) -> str:
    text = text.strip()
    fenced = _FENCE.search(text)
    if fenced and text.startswith("```"):
        return fenced.group(1).strip()
    return text.strip("`").strip()


def parse_input(raw: Any) -> Any:
    """An ``Action Input`` as data: a JSON (or Python literal) object/value when it is one, else the text.

    A one-key object whose value lost its quotes (``{"expression": 616 * 28}``)
    is read as that key with the value's text.
    """
    if not isinstance(raw, str):
        return raw
    text = _strip_fence(raw)
    if not text:
        return None
    for loader in (json.loads, ast.literal_eval):
        try:
            value = loader(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        if isinstance(value, (dict, list, str, int, float, bool)) or value is None:
            return value
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    loose = _LOOSE_OBJECT.match(text)
    if loose is not None:
        return {loose.group(2): loose.group(3)}
    return text


def _json_objects(text: str) -> list[tuple[dict[str, Any], int]]:
    """Every JSON object found in ``text`` (fenced or bare), with where it starts."""
    decoder = json.JSONDecoder()
    found = []
    i = text.find("{")
    while i != -1:
        try:
            value, end = decoder.raw_decode(text, i)
        except ValueError:
            i = text.find("{", i + 1)
            continue
        if isinstance(value, dict):
            found.append((value, i))
        i = text.find("{", end)
    return found


def _from_json(obj: dict[str, Any], thought: str) -> ParsedAction | None:
    lowered = {str(k).lower(): v for k, v in obj.items()}
    if not any(k in lowered for k in _TOOL_KEYS):
        key = next((k for k in _FINAL_KEYS if k in lowered), None)
        return None if key is None else ParsedAction("final", thought=thought, answer=_as_text(lowered[key]))
    name = next((lowered[k] for k in _TOOL_KEYS if isinstance(lowered.get(k), str)), None)
    if name is None:
        nested = lowered.get("function")
        if isinstance(nested, dict):  # {"function": {"name": ..., "arguments": ...}}, OpenAI's shape
            return _from_json(nested, thought)
        return None
    tool_input = next((lowered[k] for k in _INPUT_KEYS if k in lowered), None)
    if _clean_name(name).lower() in _FINAL_NAMES:
        return ParsedAction("final", thought=thought, answer=_as_text(tool_input))
    if isinstance(tool_input, str):
        tool_input = parse_input(tool_input)
    return ParsedAction("tool", thought=thought, tool=_clean_name(name), tool_input=tool_input)


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value.strip()
    return json.dumps(value, ensure_ascii=False)


def _section(text: str, start: int) -> str:
    """Text from ``start`` up to the next marker line (or the end)."""
    rest = text[start:]
    following = _NEXT_MARKER.search(rest)
    return (rest[: following.start()] if following else rest).strip()


def _thought(text: str, end: int) -> str:
    match = _THOUGHT.search(text, 0, end)
    chunk = text[match.end() : end] if match else text[:end]
    return re.sub(r"```[A-Za-z]*", "", chunk).strip().rstrip("*_#`").strip()


def parse_action(text: str | None) -> ParsedAction:
    """Read one model reply; never raises (a malformed action is ``kind="invalid"``)."""
    text = (text or "").strip()
    if not text:
        return ParsedAction("invalid", error="the reply is empty")
    observed = _OBSERVATION.search(text)
    if observed is not None and observed.start() > 0:
        text = text[: observed.start()].rstrip()  # the model wrote its own observation: ignore it and what follows
    action = _ACTION.search(text)
    final = _FINAL.search(text)
    if action is not None and (final is None or action.start() < final.start()):
        return _text_action(text, action)
    if final is not None:
        answer = _section(text, final.end())
        return ParsedAction("final", thought=_thought(text, final.start()), answer=answer)
    objects = _json_objects(text)
    for obj, start in objects:
        parsed = _from_json(obj, _thought(text, start) if start else "")
        if parsed is not None:
            return parsed
    if "```json" in text.lower() or text.startswith("{"):
        if objects:
            error = "the JSON action block has no 'action' (a tool name) or 'final_answer' key"
        else:
            error = "the JSON action block is not valid JSON"
        return ParsedAction("invalid", thought=text if not text.startswith("{") else "", error=error)
    return ParsedAction("none", thought=text)


def _text_action(text: str, action: re.Match[str]) -> ParsedAction:
    thought = _thought(text, action.start())
    after = text[action.end() :]
    input_match = _ACTION_INPUT.search(text, action.end())
    name_line = after.split("\n", 1)[0]
    if input_match is not None and input_match.start() - action.end() < len(name_line):
        name_line = text[action.end() : input_match.start()]  # Action: x Action Input: y on one line
    name_raw = name_line.strip()
    tool_input: Any = None
    bracket = _BRACKET_CALL.match(name_raw.strip("`*"))
    if bracket is not None:
        name_raw, tool_input = bracket.group(1), parse_input(bracket.group(2))
    name = _clean_name(name_raw)
    if input_match is not None:
        raw_input = _strip_fence(_section(text, input_match.end()))
        tool_input = parse_input(raw_input)
        if raw_input.startswith("{") and isinstance(tool_input, str):
            return ParsedAction(
                "invalid", thought=thought, tool=_clean_name(name_raw), error="'Action Input:' is not valid JSON"
            )
    if not name:
        return ParsedAction("invalid", thought=thought, error="'Action:' names no tool")
    if name.lower() in _FINAL_NAMES:
        answer = tool_input if isinstance(tool_input, str) else _as_text(tool_input)
        return ParsedAction("final", thought=thought, answer=answer)
    if " " in name:
        return ParsedAction(
            "invalid", thought=thought, error=f"'Action:' must be followed by just a tool name, got {name_raw!r}"
        )
    return ParsedAction("tool", thought=thought, tool=name, tool_input=tool_input)

"""Request bodies checked before the gateway chooses a route: strict JSON, and the sampling fields' types.

A body the gateway forwards must be standard JSON (RFC 8259 has no ``NaN`` or ``Infinity``, and a
number too large for a double is not a number either): Python's parser accepts both, the policy may
not, and the store refuses to write them, so such a body is a 400 naming the field, for every route.
The OpenAI fields that decide how a completion is sampled are checked for their JSON type
only (not their range: upstreams differ there), so a client's type error is answered as a client
error here and never reaches the policy as a "policy failure". Unknown fields pass untouched.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from .errors import ApiError

__all__ = ["check_chat_body", "parse_json"]


def parse_json(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object of finite numbers, or a 400 that names what is wrong and where."""
    found: list[str] = []

    def constant(literal: str) -> float:  # NaN, Infinity, -Infinity
        found.append(literal)
        return math.nan

    def number(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):  # 1e400: too large for a double
            found.append(text)
        return value

    try:
        body = json.loads(raw, parse_constant=constant, parse_float=number)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(f"the request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object", code="invalid_json")
    if found:
        path = _path_of(body) or "(the body)"
        raise ApiError(
            f"{path}: {found[0]} is not a JSON number (numbers must be finite)", param=path, code="invalid_number"
        )
    return body


def _path_of(value: Any, path: str = "") -> str | None:
    """Where the first non-finite number of a parsed body is, e.g. ``messages[0].temperature``."""
    if isinstance(value, float) and not math.isfinite(value):
        return path
    if isinstance(value, dict):
        for key, item in value.items():
            found = _path_of(item, f"{path}.{key}" if path else str(key))
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _path_of(item, f"{path}[{i}]")
            if found is not None:
                return found
    return None


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _integer(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _stop(v: Any) -> bool:
    return isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v))


def _objects(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(m, dict) for m in v)


# field -> (check, what it must be); null passes for every one of them (OpenAI's "not given")
_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "model": (lambda v: isinstance(v, str), "a string"),
    "messages": (_objects, "a list of message objects"),
    "stream": (lambda v: isinstance(v, bool), "true or false"),
    "stream_options": (lambda v: isinstance(v, dict), "an object"),
    "temperature": (_number, "a number"),
    "top_p": (_number, "a number"),
    "presence_penalty": (_number, "a number"),
    "frequency_penalty": (_number, "a number"),
    "max_tokens": (_integer, "an integer"),
    "max_completion_tokens": (_integer, "an integer"),
    "n": (_integer, "an integer"),
    "seed": (_integer, "an integer"),
    "top_logprobs": (_integer, "an integer"),
    "logprobs": (lambda v: isinstance(v, bool), "true or false"),
    "return_token_ids": (lambda v: isinstance(v, bool), "true or false"),
    "stop": (_stop, "a string or a list of strings"),
    "tools": (_objects, "a list of tool objects"),
    "tool_choice": (lambda v: isinstance(v, (str, dict)), "a string or an object"),
    "response_format": (lambda v: isinstance(v, dict), "an object"),
    "logit_bias": (lambda v: isinstance(v, dict), "an object"),
    "metadata": (lambda v: isinstance(v, dict), "an object"),
    "user": (lambda v: isinstance(v, str), "a string"),
}


def check_chat_body(body: dict[str, Any]) -> None:
    """A 400 naming the first sampling field of a chat request whose JSON type is wrong (``"temperature": "hot"``)."""
    for key, (ok, what) in _FIELDS.items():
        value = body.get(key)
        if value is not None and not ok(value):
            raise ApiError(f"{key}: must be {what}, got {json.dumps(value)[:80]}", param=key, code="invalid_type")

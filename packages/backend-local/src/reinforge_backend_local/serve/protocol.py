"""OpenAI request parsing and validation, and the response shapes (chat and legacy completions)."""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from reinforge.plugin import ApiError

# Accepted and without effect here (they change nothing a single local policy does).
IGNORED = {"user", "metadata", "store", "parallel_tool_calls", "service_tier", "stream_options"}
# Known OpenAI fields this server cannot honour: a request that sets them to a non-default value is a 400.
UNSUPPORTED_DEFAULTS: dict[str, Any] = {
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "logit_bias": {},
    "best_of": 1,
    "echo": False,
    "suffix": None,
    "functions": None,
    "function_call": None,
    "response_format": {"type": "text"},
    "repetition_penalty": 1,
    "min_tokens": 0,
    "top_k": -1,
}
SAMPLING = {"model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "n", "seed", "stream"}
CHAT_FIELDS = SAMPLING | {"messages", "tools", "tool_choice", "logprobs", "top_logprobs", "return_token_ids"}
COMPLETION_FIELDS = SAMPLING | {"prompt", "logprobs", "return_token_ids"}
MAX_N = 16
MAX_STOP = 4
MAX_TOP_LOGPROBS = 20


@dataclass
class Sampling:
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] = field(default_factory=list)
    n: int = 1
    seed: int | None = None

    def as_dict(self, default_max_tokens: int) -> dict[str, Any]:
        """The ``sampling`` argument of :func:`~reinforge_backend_local.inference.policy.sampling_request`."""
        out: dict[str, Any] = {"max_tokens": self.max_tokens or default_max_tokens, "stop": self.stop}
        if self.temperature is not None:
            out["temperature"] = self.temperature
        if self.top_p is not None:
            out["top_p"] = self.top_p
        if self.seed is not None:
            out["seed"] = self.seed
        return out


@dataclass
class ChatRequest:
    model: str | None
    messages: list[dict[str, Any]]
    sampling: Sampling
    stream: bool = False
    include_usage: bool = False
    tools: list[dict[str, Any]] | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    return_token_ids: bool = False


@dataclass
class CompletionRequest:
    model: str | None
    prompts: list[str | list[int]]
    sampling: Sampling
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    top_logprobs: int = 0  # ``logprobs: k``: the k likeliest tokens at each position
    return_token_ids: bool = False


def parse_json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(f"the request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object", code="invalid_json")
    return body


def _int(body: dict[str, Any], key: str, low: int, high: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(f"{key} must be an integer, got {value!r}", param=key, code="invalid_type")
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ApiError(f"{key} must be {bound}, got {value}", param=key, code="invalid_value")
    return value


def _float(body: dict[str, Any], key: str, low: float, high: float, *, open_low: bool = False) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ApiError(f"{key} must be a number, got {value!r}", param=key, code="invalid_type")
    if value > high or value < low or (open_low and value <= low):
        raise ApiError(f"{key} must be in {'(' if open_low else '['}{low}, {high}], got {value}", param=key)
    return float(value)


def _bool(body: dict[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(f"{key} must be a boolean, got {value!r}", param=key, code="invalid_type")
    return value


def _check_fields(body: dict[str, Any], allowed: set[str]) -> None:
    for key, default in UNSUPPORTED_DEFAULTS.items():
        if key in allowed:
            continue
        value = body.get(key)
        if value is not None and value != default and not (key == "response_format" and value == {"type": "text"}):
            raise ApiError(f"{key} is not supported by this server", param=key, code="unsupported_parameter")
    unknown = sorted(set(body) - allowed - IGNORED - set(UNSUPPORTED_DEFAULTS))
    if unknown:
        raise ApiError(f"unknown field(s) {unknown}", param=unknown[0], code="unknown_parameter")


def _sampling(body: dict[str, Any]) -> Sampling:
    max_tokens = _int(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", 1)
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > MAX_STOP:
        raise ApiError(f"stop must be a non-empty string or a list of up to {MAX_STOP}, got {stop!r}", param="stop")
    return Sampling(
        max_tokens=max_tokens,
        temperature=_float(body, "temperature", 0.0, 2.0),
        top_p=_float(body, "top_p", 0.0, 1.0, open_low=True),
        stop=list(stop),
        n=_int(body, "n", 1, MAX_N) or 1,
        seed=_int(body, "seed", -(2**63), 2**63 - 1),
    )


def _model(body: dict[str, Any]) -> str | None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(f"model must be a string, got {model!r}", param="model", code="invalid_type")
    return model


def _include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise ApiError("stream_options must be an object", param="stream_options", code="invalid_type")
    return bool(options.get("include_usage"))


def parse_chat(body: dict[str, Any]) -> ChatRequest:
    _check_fields(body, CHAT_FIELDS)
    messages = body.get("messages")
    if messages is None:
        raise ApiError("messages is required", param="messages", code="missing_required_parameter")
    if not isinstance(messages, list) or not messages:
        raise ApiError("messages must be a non-empty list", param="messages", code="invalid_type")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(f"messages[{i}] must be an object with a role", param=f"messages[{i}]")
        content = m.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise ApiError(f"messages[{i}].content must be a string or a list of parts", param=f"messages[{i}]")
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise ApiError("tools must be a list of objects", param="tools", code="invalid_type")
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise ApiError(
            f"tool_choice {choice!r} is not supported: this server cannot force a tool call (use 'auto' or 'none')",
            param="tool_choice",
            code="unsupported_parameter",
        )
    if choice == "none":
        tools = None
    logprobs = _bool(body, "logprobs")
    top = _int(body, "top_logprobs", 0, MAX_TOP_LOGPROBS) or 0
    if top and not logprobs:
        raise ApiError("top_logprobs needs logprobs: true", param="top_logprobs", code="invalid_value")
    return ChatRequest(
        model=_model(body),
        messages=messages,
        sampling=_sampling(body),
        stream=_bool(body, "stream"),
        include_usage=_include_usage(body),
        tools=tools or None,
        logprobs=logprobs,
        top_logprobs=top,
        return_token_ids=_bool(body, "return_token_ids"),
    )


def parse_completion(body: dict[str, Any]) -> CompletionRequest:
    _check_fields(body, COMPLETION_FIELDS)
    prompt = body.get("prompt")
    if prompt is None:
        raise ApiError("prompt is required", param="prompt", code="missing_required_parameter")
    prompts: list[str | list[int]]
    if isinstance(prompt, str):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        prompts = [list(prompt)]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = list(prompt)
    elif (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(p, list) and p and all(isinstance(t, int) for t in p) for p in prompt)
    ):
        prompts = [list(p) for p in prompt]
    else:
        raise ApiError("prompt must be a string, a list of strings, token ids or lists of token ids", param="prompt")
    logprobs = _int(body, "logprobs", 0, MAX_TOP_LOGPROBS)
    return CompletionRequest(
        model=_model(body),
        prompts=prompts,
        sampling=_sampling(body),
        stream=_bool(body, "stream"),
        include_usage=_include_usage(body),
        logprobs=logprobs is not None,
        top_logprobs=logprobs or 0,
        return_token_ids=_bool(body, "return_token_ids"),
    )


# -- responses ------------------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


Alternatives = list[list[tuple[str, float]]]  # per token: (text, logprob) of the likeliest tokens


def chat_logprobs(tokens: list[str], logprobs: list[float], top: Alternatives | None = None) -> dict[str, Any]:
    def entry(t: str, lp: float) -> dict[str, Any]:
        return {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8"))}

    return {
        "content": [
            {**entry(t, lp), "top_logprobs": [entry(a, v) for a, v in top[k]] if top else []}
            for k, (t, lp) in enumerate(zip(tokens, logprobs))
        ]
    }


def completion_logprobs(
    tokens: list[str], logprobs: list[float], top: Alternatives | None = None, offset: int = 0
) -> dict[str, Any]:
    """The legacy shape; ``offset`` is where the first token's text starts (a stream's later chunks)."""
    offsets, pos = [], offset
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    tops = [dict(alts) for alts in top] if top else None
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets}


def envelope(kind: str, rid: str, model: str, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"id": rid, "object": kind, "created": int(time.time()), "model": model, "choices": choices, **extra}

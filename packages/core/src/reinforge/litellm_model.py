"""A :class:`~reinforge.models.ChatModel` over any LiteLLM provider (``reinforge[litellm]``).

For auxiliary models, model judges and baselines: anything LiteLLM reaches,
including a local OpenAI-compatible server via ``api_base``. LiteLLM is imported
on first use, so importing this module never needs the extra.
"""

from __future__ import annotations

import os
from typing import Any

from .errors import require
from .models import ChatResponse, Message

__all__ = ["LiteLLMChatModel"]

# OpenAI-compatible local servers (vLLM, our own endpoints) ignore the key, but clients insist on one.
DUMMY_API_KEY = "sk-none"


def _litellm() -> Any:
    # Without this LiteLLM fetches its model cost map over the network at import.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    litellm = require("litellm", "litellm")
    # The runner retries transient errors; a "Give Feedback" banner on each one is noise.
    litellm.suppress_debug_info = True
    return litellm


def _get(obj: Any, name: str, default: Any = None) -> Any:
    """Read a field from a LiteLLM/pydantic object or a plain dict."""
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _tool_call(call: Any) -> dict[str, Any]:
    fn = _get(call, "function")
    return {
        "id": _get(call, "id"),
        "type": _get(call, "type") or "function",
        "function": {"name": _get(fn, "name"), "arguments": _get(fn, "arguments") or "{}"},
    }


def _logprobs(choice: Any) -> list[float] | None:
    content = _get(_get(choice, "logprobs"), "content")
    if not content:
        return None
    return [float(_get(item, "logprob", 0.0)) for item in content]


class LiteLLMChatModel:
    """Chat through ``litellm.acompletion``; errors propagate so the runner can retry.

    With ``api_base`` and a model name without a LiteLLM provider prefix, the
    model is addressed as ``openai/<model>`` (an OpenAI-compatible server).
    ``defaults`` are sampling parameters; per-call ``sampling`` overrides them.
    """

    def __init__(
        self,
        model: str,
        *,
        api_base: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        num_retries: int = 0,
        **defaults: Any,
    ) -> None:
        self.model_name = model
        self.base_url = api_base
        self.api_key = DUMMY_API_KEY if api_key is None and api_base is not None else api_key
        self.timeout = timeout
        self.num_retries = num_retries
        self.defaults = defaults
        self._litellm_model: str | None = None

    def __repr__(self) -> str:
        return f"LiteLLMChatModel({self.model_name!r}, api_base={self.base_url!r})"

    @property
    def litellm_model(self) -> str:
        """The model string sent to LiteLLM (provider prefix added for ``api_base``)."""
        if self._litellm_model is None:
            model = self.model_name
            if self.base_url is not None:
                prefix = model.split("/", 1)[0] if "/" in model else None
                providers = {getattr(p, "value", p) for p in _litellm().provider_list}
                if prefix not in providers:
                    model = f"openai/{model}"
            self._litellm_model = model
        return self._litellm_model

    async def chat(
        self, messages: list[Message], tools: list[dict[str, Any]] | None = None, **sampling: Any
    ) -> ChatResponse:
        litellm = _litellm()
        params: dict[str, Any] = {**self.defaults, **sampling}
        if tools:
            params["tools"] = tools
        if self.base_url is not None:
            params["api_base"] = self.base_url
        if self.api_key is not None:
            params["api_key"] = self.api_key
        response = await litellm.acompletion(
            model=self.litellm_model,
            messages=messages,
            timeout=self.timeout,
            num_retries=self.num_retries,  # LiteLLM also hands this to the OpenAI client as max_retries
            **params,
        )
        return self._to_response(response)

    def _to_response(self, response: Any) -> ChatResponse:
        choice = _get(response, "choices")[0]
        raw = _get(choice, "message")
        message: Message = {"role": _get(raw, "role") or "assistant", "content": _get(raw, "content")}
        tool_calls = _get(raw, "tool_calls")
        if tool_calls:
            message["tool_calls"] = [_tool_call(c) for c in tool_calls]
        reasoning = _get(raw, "reasoning_content")
        if reasoning:
            message["reasoning_content"] = reasoning
        usage = _get(response, "usage")
        usage_dict = {
            key: int(_get(usage, key) or 0)
            for key in ("prompt_tokens", "completion_tokens", "total_tokens")
            if usage is not None
        }
        return ChatResponse(
            message=message,
            finish_reason=_get(choice, "finish_reason"),
            usage=usage_dict,
            logprobs=_logprobs(choice),
            model=_get(response, "model"),
        )

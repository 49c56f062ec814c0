"""The in-process policy as a ``ChatModel``: chat template in, recorded tokens out."""

from __future__ import annotations

import itertools
from typing import Any

from reinforge import ChatResponse
from reinforge.plugin import ConfigError

from .engine import GenRequest, GenResult, MicroBatcher

SAMPLING_KEYS = {"temperature", "top_p", "max_tokens", "max_completion_tokens", "stop", "seed", "n"}


class ChatTemplate:
    """Renders OpenAI messages with the tokenizer's chat template into prompt token ids."""

    def __init__(self, tokenizer: Any, max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            [_plain(m) for m in messages], tools=tools or None, add_generation_prompt=True, tokenize=False
        )
        ids = self.tokenizer(text, add_special_tokens=False).input_ids
        if len(ids) >= self.max_model_len:
            raise ConfigError(
                f"model.max_model_len is {self.max_model_len} tokens, but a prompt has {len(ids)}: "
                "raise max_model_len or shorten the prompt"
            )
        return ids


def _plain(message: dict[str, Any]) -> dict[str, Any]:
    """Chat templates want string content; OpenAI content parts are joined."""
    content = message.get("content")
    if isinstance(content, list):
        message = {**message, "content": "".join(p.get("text", "") for p in content if isinstance(p, dict))}
    elif content is None:
        message = {**message, "content": ""}
    return message


def sampling_request(
    prompt_ids: list[int], sampling: dict[str, Any], defaults: dict[str, Any], seed_key: tuple, order_key: tuple
) -> GenRequest:
    params = {**defaults, **{k: v for k, v in sampling.items() if v is not None}}
    unknown = sorted(set(sampling) - SAMPLING_KEYS - {"tool_choice", "logprobs", "top_logprobs", "user", "stream"})
    if unknown:
        raise ConfigError(f"the local policy does not support sampling parameter(s) {unknown}")
    if params.get("n", 1) != 1:
        raise ConfigError("the local policy returns one choice per call (n=1); call it once per sample")
    stop = params.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    max_tokens = params.get("max_completion_tokens") or params.get("max_tokens") or 512
    if params.get("seed") is not None:
        seed_key = ("seed", params["seed"], *seed_key[-1:])
    return GenRequest(
        prompt_ids=prompt_ids,
        max_tokens=int(max_tokens),
        temperature=float(params.get("temperature", 1.0)),
        top_p=float(params.get("top_p", 1.0)),
        stop=list(stop),
        seed_key=seed_key,
        order_key=order_key,
    )


def to_response(result: GenResult, prompt_ids: list[int], version: int, model_name: str) -> ChatResponse:
    return ChatResponse(
        message={"role": "assistant", "content": result.text},
        finish_reason=result.finish_reason,
        usage={
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(result.token_ids),
            "total_tokens": len(prompt_ids) + len(result.token_ids),
        },
        prompt_token_ids=prompt_ids,
        completion_token_ids=result.token_ids,
        logprobs=result.logprobs,
        policy_version=version,
        model=model_name,
    )


class PolicyChatModel:
    """What one rollout's workflow talks to; its calls are batched with every other rollout's.

    ``base_url`` is this rollout's own OpenAI-compatible endpoint, so an agent
    built with another framework is recorded into the same trajectory.
    """

    supports_tools = False  # small chat templates here do not render tool calls back

    def __init__(
        self,
        batcher: MicroBatcher,
        template: ChatTemplate,
        *,
        seed_key: tuple,
        order_key: tuple,
        version: int,
        model_name: str,
        base_url: str | None = None,
        defaults: dict[str, Any] | None = None,
        on_release: Any = None,
    ) -> None:
        self.batcher = batcher
        self.template = template
        self.seed_key = seed_key
        self.order_key = order_key
        self.version = version
        self.model_name = model_name
        self.base_url = base_url
        self.api_key = "reinforge-local"
        self.defaults = dict(defaults or {})
        self._calls = itertools.count()
        self.episode = object()  # this rollout, for the engine's kept keys and values (dropped on release)
        self._released = False
        self._on_release = on_release
        batcher.rollout_started()

    def prepare(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, sampling: dict[str, Any]
    ) -> GenRequest:
        """The generation request for this rollout's next call (in-process or over HTTP)."""
        prompt_ids = self.template.prompt_ids(messages, tools)
        index = next(self._calls)
        request = sampling_request(
            prompt_ids, sampling, self.defaults, (*self.seed_key, index), (*self.order_key, index)
        )
        request.episode = self.episode  # the next call continues this conversation: its keys and values are kept
        return request

    async def chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, **sampling: Any
    ) -> ChatResponse:
        request = self.prepare(messages, tools, sampling)
        result = await self.batcher.submit(request)
        return to_response(result, request.prompt_ids, self.version, self.model_name)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.batcher.engine.forget(self.episode)
            self.batcher.rollout_finished()
            if self._on_release is not None:
                self._on_release(self)

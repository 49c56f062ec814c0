"""A deterministic :class:`~reinforge.models.ChatModel` for tests.

Workflows, judges and the runner are tested without a model server: the
replies are scripted, every call is recorded, and the responses carry fake
token ids and logprobs so code that trains on tokens has something to read.
Token ids are the UTF-8 bytes of the text, so ``bytes(ids).decode()`` gives it back.
"""

from __future__ import annotations

import copy
import inspect
import json
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

from ..errors import ReinforgeError
from ..models import ChatResponse, Message

__all__ = ["ScriptedCall", "ScriptedChatModel", "ScriptExhaustedError"]

ReplyItem = str | dict[str, Any] | ChatResponse | BaseException
ReplyFn = Callable[[list[Message], list[dict[str, Any]] | None, dict[str, Any]], Any]


class ScriptExhaustedError(ReinforgeError, RuntimeError):
    """The model was called more times than it has scripted replies."""


class ScriptedCall(NamedTuple):
    """One recorded call; unpacks as ``messages, tools, sampling``."""

    messages: list[Message]
    tools: list[dict[str, Any]] | None
    sampling: dict[str, Any]


def _render(messages: list[Message]) -> str:
    parts = []
    for m in messages:
        content = m.get("content")
        if not isinstance(content, str):
            content = json.dumps(content, sort_keys=True, default=str) if content is not None else ""
        parts.append(f"{m.get('role', '')}: {content}")
    return "\n".join(parts)


def _token_ids(text: str) -> list[int]:
    return list(text.encode("utf-8"))


class ScriptedChatModel:
    """Answers from a script: a list consumed in order, or a function.

    List items: ``str`` (assistant content), ``dict`` (assistant message, may
    hold ``tool_calls``), :class:`ChatResponse` (returned as-is) or an exception
    instance (raised, e.g. to test retries). A callable gets
    ``(messages, tools, sampling)`` and may be sync or async.
    ``finish_reason=None`` means "tool_calls" when the reply has tool calls, else "stop".
    """

    def __init__(
        self,
        replies: list[ReplyItem] | ReplyFn,
        *,
        finish_reason: str | None = None,
        model_name: str = "scripted",
        policy_version: int | None = None,
    ) -> None:
        self._fn: ReplyFn | None = replies if callable(replies) else None
        self._script: list[ReplyItem] = [] if callable(replies) else list(replies)
        self.finish_reason = finish_reason
        self.model_name = model_name
        self.policy_version = policy_version
        self.calls: list[ScriptedCall] = []
        self._lock = threading.Lock()
        self._next = 0

    @property
    def remaining(self) -> int:
        """Scripted replies not consumed yet (0 for a callable script)."""
        return len(self._script) - self._next

    async def chat(
        self, messages: list[Message], tools: list[dict[str, Any]] | None = None, **sampling: Any
    ) -> ChatResponse:
        call = ScriptedCall(copy.deepcopy(list(messages)), copy.deepcopy(tools), dict(sampling))
        with self._lock:
            self.calls.append(call)
            index = self._next
            if self._fn is None:
                if index >= len(self._script):
                    raise ScriptExhaustedError(
                        f"ScriptedChatModel has {len(self._script)} scripted replies and was called "
                        f"{len(self.calls)} times; last user message: {_last_user(messages)!r}"
                    )
                self._next += 1
        if self._fn is not None:
            item = self._fn(call.messages, call.tools, call.sampling)
            if inspect.isawaitable(item):
                item = await item
        else:
            item = self._script[index]
        return self._respond(item, call.messages)

    def _respond(self, item: Any, messages: list[Message]) -> ChatResponse:
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, type) and issubclass(item, BaseException):
            raise item()
        if isinstance(item, ChatResponse):
            return item
        if isinstance(item, str):
            message: Message = {"role": "assistant", "content": item}
        elif isinstance(item, dict):
            message = {"role": "assistant", "content": None, **copy.deepcopy(item)}
        else:
            raise TypeError(f"a scripted reply must be str, dict, ChatResponse or an exception, got {item!r}")
        tool_calls = message.get("tool_calls") or []
        completion = (message.get("content") or "") + (json.dumps(tool_calls, sort_keys=True) if tool_calls else "")
        prompt_ids, completion_ids = _token_ids(_render(messages)), _token_ids(completion)
        return ChatResponse(
            message=message,
            finish_reason=self.finish_reason or ("tool_calls" if tool_calls else "stop"),
            usage={
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(completion_ids),
                "total_tokens": len(prompt_ids) + len(completion_ids),
            },
            prompt_token_ids=prompt_ids,
            completion_token_ids=completion_ids,
            logprobs=[0.0] * len(completion_ids),
            policy_version=self.policy_version,
            model=self.model_name,
        )


def _last_user(messages: list[Message]) -> Any:
    for m in reversed(messages):
        if m.get("role") == "user":
            return m.get("content")
    return None

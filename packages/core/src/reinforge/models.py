"""The model a workflow talks to: a small protocol over OpenAI-format messages.

RL trains on tokens, not text, so a :class:`ChatResponse` carries the token ids
and sampling logprobs when the backend knows them, and every call a workflow
makes is recorded into its trajectory as a :class:`ModelCall`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .trajectory import Trajectory

Message = dict[str, Any]


def openai_message(message: Message) -> Message:
    """``message`` as an OpenAI client expects an assistant message: role, a content key, tool call ids and
    JSON-string arguments (a workflow's or a script's message may omit them, or hold the arguments as a dict)."""
    out = {"role": "assistant", "content": None, **message}
    calls = []
    for i, call in enumerate(out.get("tool_calls") or []):
        fn = dict(call.get("function") or {})
        args = fn.get("arguments", "{}")
        fn["arguments"] = args if isinstance(args, str) else json.dumps(args)
        calls.append({"id": call.get("id") or f"call_{i}", "type": call.get("type", "function"), "function": fn})
    if calls:
        out["tool_calls"] = calls
    else:
        out.pop("tool_calls", None)
    return out


@dataclass
class ChatResponse:
    """One assistant turn, plus what RL needs to train on it."""

    message: Message
    finish_reason: str | None = "stop"
    usage: dict[str, int] = field(default_factory=dict)
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    policy_version: int | None = None
    model: str | None = None

    @property
    def content(self) -> str:
        """The assistant text ("" when the turn only has tool calls)."""
        return self.message.get("content") or ""

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return list(self.message.get("tool_calls") or [])

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    def get_text_content(self) -> str:
        """AgentScope ``Msg``-style accessor, so tutorial judges work on it."""
        return self.content

    def __str__(self) -> str:
        return self.content


@runtime_checkable
class ChatModel(Protocol):
    """Anything a workflow can chat with.

    ``sampling`` takes OpenAI parameter names (temperature, top_p, max_tokens,
    stop, seed, ...). Implementations raise on transport failures; the runner
    turns an exception into a transient ``FAILED`` rollout.
    """

    async def chat(
        self, messages: list[Message], tools: list[dict[str, Any]] | None = None, **sampling: Any
    ) -> ChatResponse: ...


@dataclass
class ModelCall:
    """One recorded model call of a trajectory."""

    messages: list[Message]
    response: ChatResponse
    tools: list[dict[str, Any]] | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    started_at: float = 0.0
    seconds: float = 0.0
    reward: float | None = None  # this call's own reward (``WorkflowOutput.call_rewards``), if any

    @property
    def prompt_token_ids(self) -> list[int] | None:
        return self.response.prompt_token_ids

    @property
    def completion_token_ids(self) -> list[int] | None:
        return self.response.completion_token_ids

    @property
    def logprobs(self) -> list[float] | None:
        return self.response.logprobs

    @property
    def policy_version(self) -> int | None:
        return self.response.policy_version

    def to_dict(self) -> dict[str, Any]:
        r = self.response
        return {
            "messages": self.messages,
            "tools": self.tools,
            "sampling": self.sampling,
            "message": r.message,
            "finish_reason": r.finish_reason,
            "usage": r.usage,
            "prompt_token_ids": r.prompt_token_ids,
            "completion_token_ids": r.completion_token_ids,
            "logprobs": r.logprobs,
            "policy_version": r.policy_version,
            "seconds": self.seconds,
            "reward": self.reward,
        }


class RecordingChatModel:
    """Wraps a model so every call lands in one trajectory.

    Backends that record at their own layer (an HTTP endpoint, say) can append
    :class:`ModelCall` objects to ``trajectory.calls`` themselves instead.
    """

    def __init__(self, model: ChatModel, trajectory: Trajectory, defaults: dict[str, Any] | None = None) -> None:
        self.model = model
        self.trajectory = trajectory
        self.defaults = dict(defaults or {})

    def __getattr__(self, name: str) -> Any:
        # Expose the wrapped model's extras (base_url, model_name, ...).
        return getattr(self.model, name)

    async def chat(
        self, messages: list[Message], tools: list[dict[str, Any]] | None = None, **sampling: Any
    ) -> ChatResponse:
        params = {**self.defaults, **sampling}
        sent = [dict(m) for m in messages]
        start = time.perf_counter()
        response = await self.model.chat(sent, tools=tools, **params)
        self.trajectory.calls.append(
            ModelCall(
                messages=sent,
                response=response,
                tools=tools,
                sampling=params,
                started_at=start,
                seconds=time.perf_counter() - start,
            )
        )
        return response

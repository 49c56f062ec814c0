"""AgentScope 1.x's ``ReActAgent`` with a ``Toolkit`` runs against ``reinforge serve`` (acceptance).

The real app (SmolLM2) on the real uvicorn, on 127.0.0.1; AgentScope's ``OpenAIChatModel`` talks to
it through the openai SDK, streamed and not. A small ASGI middleware records what reached
``/v1/chat/completions`` and what status went back, so the test sees that the agent offered its
tool and that the server accepted every request AgentScope made.

Needs ``reinforge[agentscope]``: skipped elsewhere, run by ``nox -s agentscope``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("agentscope", reason="needs reinforge[agentscope]; `nox -s agentscope` runs this module")

from agentscope.agent import ReActAgent
from agentscope.formatter import OpenAIChatFormatter
from agentscope.memory import InMemoryMemory
from agentscope.message import Msg, TextBlock
from agentscope.model import OpenAIChatModel
from agentscope.tool import Toolkit, ToolResponse

from reinforge.testing import BackgroundServer

KEY = "agentscope-key"
CHAT_PATH = "/v1/chat/completions"


def _delta_has_audio() -> bool:
    from openai.types.chat.chat_completion_chunk import ChoiceDelta

    return "audio" in getattr(ChoiceDelta, "model_fields", {})


# AgentScope 1.0.21's streamed OpenAIChatModel reads ``"data" in choice.delta.audio`` whenever the delta
# *has* the attribute; openai >= 3.25 declares ``ChoiceDelta.audio`` (None on a text delta), so every
# streamed chunk, from any server, raises TypeError there. Strict: this flags the day AgentScope fixes it.
_STREAM = pytest.param(
    True,
    id="stream",
    marks=pytest.mark.xfail(
        _delta_has_audio(),
        reason="AgentScope 1.x streaming breaks on openai>=3.25 (ChoiceDelta.audio is None)",
        raises=TypeError,
        strict=True,
    ),
)


class RecordChat:
    """ASGI middleware: each ``/v1/chat/completions`` request's JSON body and its response status."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.calls: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != CHAT_PATH:
            await self.app(scope, receive, send)
            return
        call: dict[str, Any] = {"body": b"", "status": None}
        self.calls.append(call)

        async def receiving() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                call["body"] += message.get("body", b"")
            return message

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                call["status"] = message["status"]
            await send(message)

        await self.app(scope, receiving, sending)

    def requests(self) -> list[tuple[dict[str, Any], int | None]]:
        return [(json.loads(c["body"]), c["status"]) for c in self.calls]


@pytest.fixture(scope="module")
def recorded(served: Any) -> Iterator[tuple[BackgroundServer, RecordChat]]:
    from reinforge_backend_local.serve.app import build_app

    model, metrics = served
    app = RecordChat(build_app(model, api_key=KEY, metrics=metrics))
    with BackgroundServer(app) as server:
        yield server, app


def add(a: int, b: int) -> ToolResponse:
    """Add two integers.

    Args:
        a (int): The first number.
        b (int): The second number.
    """
    return ToolResponse(content=[TextBlock(type="text", text=str(a + b))])


@pytest.mark.parametrize("stream", [pytest.param(False, id="plain"), _STREAM])
def test_react_agent_with_a_toolkit(recorded: tuple[BackgroundServer, RecordChat], served: Any, stream: bool) -> None:
    server, recorder = recorded
    recorder.calls.clear()
    toolkit = Toolkit()
    toolkit.register_tool_function(add)
    model = OpenAIChatModel(
        model_name=served[0].name,
        api_key=KEY,
        stream=stream,
        client_kwargs={"base_url": f"{server.base}/v1", "max_retries": 0, "timeout": 120},
        generate_kwargs={"max_tokens": 16, "temperature": 0},
    )
    agent = ReActAgent(
        name="calculator",
        sys_prompt="You are a calculator. Use the add tool to add numbers.",
        model=model,
        formatter=OpenAIChatFormatter(),
        toolkit=toolkit,
        memory=InMemoryMemory(),
        max_iters=2,
    )

    reply = asyncio.run(agent(Msg("user", "What is 2 + 3?", "user")))

    assert isinstance(reply, Msg) and reply.role == "assistant" and reply.name == "calculator"
    assert (reply.get_text_content() or "").strip(), "the reply has no text"
    requests = recorder.requests()
    assert requests, "the agent made no chat request"
    assert [status for _, status in requests] == [200] * len(requests)
    first, _ = requests[0]
    assert first["model"] == served[0].name and bool(first.get("stream")) is stream
    offered = [t["function"]["name"] for t in first.get("tools") or []]
    assert "add" in offered
    schema = next(t for t in first["tools"] if t["function"]["name"] == "add")["function"]["parameters"]
    assert set(schema["properties"]) == {"a", "b"}
    system, user = first["messages"][0], first["messages"][-1]  # AgentScope sends content parts and a name
    assert system["role"] == "system" and "calculator" in json.dumps(system["content"])
    assert user["role"] == "user" and "2 + 3" in json.dumps(user["content"])

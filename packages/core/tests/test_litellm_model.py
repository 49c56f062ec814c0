"""LiteLLMChatModel: real LiteLLM calls against a real OpenAI-compatible server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from reinforge.errors import MissingExtraError
from reinforge.litellm_model import LiteLLMChatModel
from reinforge.models import ChatModel
from reinforge.testing import Reply

litellm = pytest.importorskip("litellm")

USER = [{"role": "user", "content": "what is 2 plus 2"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]


def run(coro):
    return asyncio.run(coro)


def test_plain_completion(openai_server) -> None:
    srv = openai_server(lambda body: "it is four", model_name="policy")
    model = LiteLLMChatModel("policy", api_base=srv.base_url, temperature=0.2, max_tokens=32)
    assert isinstance(model, ChatModel)
    assert model.base_url == srv.base_url and model.model_name == "policy"
    r = run(model.chat(USER, temperature=0.9))
    assert r.content == "it is four"
    assert r.message["role"] == "assistant" and "tool_calls" not in r.message
    assert r.finish_reason == "stop"
    assert r.usage == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    sent = srv.requests[0]
    assert sent["model"] == "policy"  # the openai/ prefix is LiteLLM routing, not sent on the wire
    assert sent["messages"] == USER
    assert sent["temperature"] == 0.9 and sent["max_tokens"] == 32  # per-call sampling overrides defaults


def test_model_with_slash_gets_openai_prefix_only_when_not_a_provider(openai_server) -> None:
    srv = openai_server(lambda body: "ok")
    assert LiteLLMChatModel("Qwen/Qwen2.5-0.5B", api_base=srv.base_url).litellm_model == "openai/Qwen/Qwen2.5-0.5B"
    assert LiteLLMChatModel("hosted_vllm/m", api_base=srv.base_url).litellm_model == "hosted_vllm/m"
    assert LiteLLMChatModel("gpt-4o-mini").litellm_model == "gpt-4o-mini"
    run(LiteLLMChatModel("Qwen/Qwen2.5-0.5B", api_base=srv.base_url).chat(USER))
    assert srv.requests[0]["model"] == "Qwen/Qwen2.5-0.5B"


def test_tool_calls_round_trip(openai_server) -> None:
    def responder(body):
        if body["messages"][-1]["role"] == "tool":
            return "the answer is " + body["messages"][-1]["content"]
        return {
            "content": None,
            "tool_calls": [{"id": "call_7", "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}],
        }

    srv = openai_server(responder)
    model = LiteLLMChatModel("m", api_base=srv.base_url)
    first = run(model.chat(USER, tools=TOOLS))
    assert first.finish_reason == "tool_calls"
    assert first.tool_calls == [
        {"id": "call_7", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 2}'}}
    ]
    assert srv.requests[0]["tools"][0]["function"]["name"] == "add"

    args = json.loads(first.tool_calls[0]["function"]["arguments"])
    history = USER + [first.message, {"role": "tool", "tool_call_id": "call_7", "content": str(args["a"] + args["b"])}]
    second = run(model.chat(history, tools=TOOLS))
    assert second.content == "the answer is 4"
    echoed = srv.requests[1]["messages"][1]
    assert echoed["role"] == "assistant" and echoed["tool_calls"][0]["id"] == "call_7"


def test_server_error_raises_without_retrying(openai_server) -> None:
    srv = openai_server(lambda body: Reply(status=500, content="backend exploded"))
    with pytest.raises(litellm.exceptions.InternalServerError, match="backend exploded"):
        run(LiteLLMChatModel("m", api_base=srv.base_url).chat(USER))
    assert srv.call_count == 1


def test_rate_limit_and_malformed_body_raise(openai_server) -> None:
    replies = iter([Reply(status=429, content="slow down"), Reply(raw_body=b"{not json")])
    srv = openai_server(lambda body: next(replies))
    model = LiteLLMChatModel("m", api_base=srv.base_url)
    with pytest.raises(litellm.exceptions.RateLimitError, match="slow down"):
        run(model.chat(USER))
    with pytest.raises(litellm.exceptions.InternalServerError, match="invalid response"):
        run(model.chat(USER))


def test_num_retries_retries_transient_errors(openai_server) -> None:
    replies = iter([Reply(status=500, content="flaky"), "fine"])
    srv = openai_server(lambda body: next(replies))
    r = run(LiteLLMChatModel("m", api_base=srv.base_url, num_retries=1).chat(USER))
    assert r.content == "fine" and srv.call_count == 2


def test_auth_failure_raises_and_right_key_works(openai_server) -> None:
    srv = openai_server(lambda body: "welcome", api_key="secret")
    with pytest.raises(litellm.exceptions.AuthenticationError):
        run(LiteLLMChatModel("m", api_base=srv.base_url, api_key="wrong").chat(USER))
    with pytest.raises(litellm.exceptions.AuthenticationError):
        run(LiteLLMChatModel("m", api_base=srv.base_url).chat(USER))  # dummy key "sk-none"
    assert run(LiteLLMChatModel("m", api_base=srv.base_url, api_key="secret").chat(USER)).content == "welcome"


def test_timeout_raises(openai_server) -> None:
    srv = openai_server(lambda body: Reply(content="too late", delay=30))
    with pytest.raises(litellm.exceptions.Timeout):
        run(LiteLLMChatModel("m", api_base=srv.base_url, timeout=0.3).chat(USER))


def test_missing_litellm_raises_missing_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "litellm", None)  # makes `import litellm` fail
    model = LiteLLMChatModel("m", api_base="http://127.0.0.1:9/v1")  # constructing needs no litellm
    with pytest.raises(MissingExtraError, match=r"reinforge\[litellm\]"):
        run(model.chat(USER))

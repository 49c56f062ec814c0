"""LiteLLM through the real gateway: ``litellm.completion``/``acompletion`` with ``api_base`` at its /v1.

Unsampled requests must answer exactly what LiteLLM gets from the upstream directly; sampled ones
are answered by the policy and recorded with their token ids, streamed or not.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download of the cost map at import
litellm = pytest.importorskip("litellm", reason="needs litellm (reinforge-online[testing])")

from online_testlib import (  # noqa: E402
    HTTP,
    SECRET,
    TRAFFIC_KEY,
    UPSTREAM_KEY,
    recorded_policy_call,
)

from reinforge_online import feedback_token  # noqa: E402

MESSAGES = [{"role": "user", "content": "hi"}]
CALLS = ["completion", "acompletion"]


def gw(server: Any) -> Any:
    return server.server.config.app.state.gateway


def ask(call: str, api_base: str, stream: bool, api_key: str = TRAFFIC_KEY) -> dict[str, Any]:
    """One LiteLLM call (sync or async, streamed or not) as what its caller reads from it."""
    kwargs: dict[str, Any] = {
        "model": "openai/gpt-up",
        "messages": MESSAGES,
        "api_base": api_base,
        "api_key": api_key,
        "stream": stream,
        "max_retries": 0,
        "timeout": 10,
    }

    async def collect_async() -> tuple[Any, list[Any]]:
        out = await litellm.acompletion(**kwargs)
        return out, ([chunk async for chunk in out] if stream else [])

    if call == "completion":
        out = litellm.completion(**kwargs)
        chunks = list(out) if stream else []
    else:
        out, chunks = asyncio.run(collect_async())
    # the response headers LiteLLM hands its caller: the gateway's trace headers among them, on sampled calls
    headers = (getattr(out, "_hidden_params", None) or {}).get("additional_headers") or {}
    trace = {k.removeprefix("llm_provider-"): v for k, v in headers.items() if "x-reinforge-" in k}
    if not stream:
        choice = out.choices[0]
        return {
            "id": out.id,
            "model": out.model,
            "content": choice.message.content,
            "finish_reason": choice.finish_reason,
            "usage": (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens),
            "trace": trace,
        }
    return {
        "ids": sorted({c.id for c in chunks}),
        "content": "".join(c.choices[0].delta.content or "" for c in chunks if c.choices),
        "finish_reason": [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason],
        "trace": trace,
    }


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("call", CALLS)
def test_unsampled_answers_what_the_upstream_answers(gateway, upstream, fakes, call, stream):
    up, pol = fakes
    server = gateway()  # sampling_rate 0
    direct = ask(call, upstream[1].v1, stream, api_key=UPSTREAM_KEY)
    via = ask(call, server.v1, stream)
    assert via == direct
    assert via["content"] == ("up stream" if stream else "from the upstream \u00e9")
    assert via["trace"] == {}  # not sampled: no trace headers
    headers, _ = up.requests[-1]
    assert headers["authorization"] == f"Bearer {UPSTREAM_KEY}"  # the gateway's key, not LiteLLM's
    assert up.bodies()[-1]["model"] == "gpt-up" and bool(up.bodies()[-1].get("stream")) is stream
    assert pol.requests == [] and gw(server).store.count("calls") == 0


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("call", CALLS)
def test_sampled_is_answered_by_the_policy_and_recorded_with_token_ids(gateway, fakes, call, stream):
    up, pol = fakes
    server = gateway(selection={"sampling_rate": 1.0})
    via = ask(call, server.v1, stream)
    assert via["content"] == "policy"
    assert via["finish_reason"] == (["stop"] if stream else "stop")
    sent = pol.bodies()[-1]
    assert sent["return_token_ids"] is True and sent["logprobs"] is True and sent["model"] == "pol"
    assert up.requests == []
    trace_id, _ = recorded_policy_call(gw(server).store, MESSAGES)
    # LiteLLM's caller sees the trace's headers, enough to close or rate it later
    token = feedback_token(SECRET, trace_id)
    assert via["trace"] == {"x-reinforge-trace-id": trace_id, "x-reinforge-feedback-token": token}
    r = HTTP.post(f"{server.base}/online/v1/traces/{trace_id}/close", headers={"x-reinforge-feedback-token": token})
    assert r.status_code == 200 and r.json()["state"] == "open"

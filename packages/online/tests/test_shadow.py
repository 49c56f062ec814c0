"""Shadow mode through the real gateway: the upstream answers, the policy re-runs the request in the background."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from online_testlib import (
    POLICY_PROMPT_IDS,
    POLICY_TOKENS,
    POLICY_VERSION,
    TOOL_CALLS,
    TRAFFIC_KEY,
    UPSTREAM_BODY,
    UPSTREAM_CHUNKS,
)

from reinforge.plugin import ConfigError

BODY = {"model": "gpt-up", "messages": [{"role": "user", "content": "say policy"}], "metadata": {"answer": "policy"}}
AUTH = {"authorization": f"Bearer {TRAFFIC_KEY}"}


def gw(server: Any) -> Any:
    return server.server.config.app.state.gateway


def shadow(gateway: Any, **overrides: Any) -> Any:
    return gateway(mode="shadow", selection={"sampling_rate": 1.0}, **overrides)


def policy_bodies(fakes: Any) -> list[dict[str, Any]]:
    return fakes[1].bodies()


def test_the_user_gets_the_upstreams_answer_and_the_policys_rerun_is_recorded_and_judged(gateway, fakes):
    server = shadow(gateway, reward={"judges": ["exact_match"]})
    r = httpx.post(f"{server.v1}/chat/completions", json=BODY, headers=AUTH)
    assert r.status_code == 200 and r.content == UPSTREAM_BODY  # the upstream's bytes, untouched
    assert "x-reinforge-trace-id" not in r.headers  # the user rated nothing the policy said: no feedback token
    assert gw(server).shadow.wait_finished(1, timeout=10)
    (sent,) = policy_bodies(fakes)
    assert sent["messages"] == BODY["messages"] and sent["model"] == "pol" and sent["stream"] is False
    assert sent["return_token_ids"] is True and "metadata" not in sent
    (trace_id,) = gw(server).store.trace_ids()
    assert gw(server).pipeline.rewards.wait_results(1, timeout=10)
    gw(server).store.submit(lambda db: None).result(10)
    trace = gw(server).store.trace(trace_id)
    assert trace["mode"] == "shadow" and trace["reward"] == 1.0 and trace["task"] == {"answer": "policy"}
    (call,) = trace["calls"]
    assert call["token_ids"] == POLICY_TOKENS and call["prompt_token_ids"] == POLICY_PROMPT_IDS
    assert call["policy_version"] == POLICY_VERSION
    assert gw(server).metrics.shadow.labels("recorded")._value.get() == 1


def test_a_streamed_request_streams_from_the_upstream_and_is_rerun_whole(gateway, fakes):
    server = shadow(gateway)
    with httpx.stream("POST", f"{server.v1}/chat/completions", json={**BODY, "stream": True}, headers=AUTH) as r:
        assert b"".join(r.iter_raw()) == b"".join(UPSTREAM_CHUNKS)
    assert gw(server).shadow.wait_finished(1, timeout=10)
    assert policy_bodies(fakes)[0]["stream"] is False
    assert gw(server).store.count("calls") == 1


def test_an_allowlisted_tool_runs_and_the_shadow_run_goes_on(gateway, fakes):
    TOOL_CALLS.clear()
    fakes[1].behaviour = "tool:lookup"
    server = shadow(gateway, shadow={"tools": {"lookup": "online_testlib:lookup"}})
    httpx.post(f"{server.v1}/chat/completions", json=BODY, headers=AUTH)
    assert gw(server).shadow.wait_finished(1, timeout=10)
    assert TOOL_CALLS == [{"query": "q"}]
    first, second = policy_bodies(fakes)
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call-1", "content": "found q"}
    (trace_id,) = gw(server).store.trace_ids()
    assert len(gw(server).store.trace(trace_id)["calls"]) == 2
    assert gw(server).metrics.shadow.labels("recorded")._value.get() == 1


def test_a_tool_not_on_the_allowlist_is_never_run_and_the_shadow_run_stops_there(gateway, fakes):
    TOOL_CALLS.clear()
    fakes[1].behaviour = "tool:send_email"  # a side effect: the gateway must not do it
    server = shadow(gateway, shadow={"tools": {"lookup": "online_testlib:lookup"}})
    r = httpx.post(f"{server.v1}/chat/completions", json=BODY, headers=AUTH)
    assert r.content == UPSTREAM_BODY
    assert gw(server).shadow.wait_finished(1, timeout=10)
    assert len(policy_bodies(fakes)) == 1 and TOOL_CALLS == []
    (trace_id,) = gw(server).store.trace_ids()
    (call,) = gw(server).store.trace(trace_id)["calls"]
    assert call["response"]["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "send_email"
    assert gw(server).metrics.shadow.labels("stopped")._value.get() == 1


def test_a_full_shadow_queue_drops_and_counts_without_delaying_anyone(gateway, fakes):
    fakes[1].behaviour = "hang"
    server = shadow(gateway, shadow={"queue_size": 1, "concurrency": 1})
    with httpx.Client(headers=AUTH) as client:
        assert client.post(f"{server.v1}/chat/completions", json=BODY).content == UPSTREAM_BODY
        assert fakes[1].wait_requests(1)  # the one worker is busy with it
        for _ in range(2):  # one waits in the queue, the other finds it full
            assert client.post(f"{server.v1}/chat/completions", json=BODY).content == UPSTREAM_BODY
    assert gw(server).metrics.shadow.labels("dropped")._value.get() == 1
    fakes[1].hold.set()
    assert gw(server).shadow.wait_finished(2, timeout=10)
    assert gw(server).store.count("traces") == 2


def test_a_policy_that_is_down_costs_the_user_nothing(gateway, fakes):
    fakes[1].fail = True
    server = shadow(gateway)
    r = httpx.post(f"{server.v1}/chat/completions", json=BODY, headers=AUTH)
    assert r.status_code == 200 and r.content == UPSTREAM_BODY
    assert gw(server).shadow.wait_finished(1, timeout=10)
    assert gw(server).store.count("calls") == 0
    assert gw(server).metrics.shadow.labels("failed")._value.get() == 1


def test_shadow_is_off_by_default_and_its_tools_must_resolve(tmp_path):
    from online_testlib import SECRETS, settings

    from reinforge_online.app import build_app

    assert settings("http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1", tmp_path / "a.sqlite").mode == "route"
    s = settings(
        "http://127.0.0.1:1/v1",
        "http://127.0.0.1:2/v1",
        tmp_path / "b.sqlite",
        mode="shadow",
        shadow={"tools": {"search": "online_testlib:no_such_tool"}},
    )
    with pytest.raises(ConfigError, match="shadow.tools.search"):
        build_app(s, SECRETS)

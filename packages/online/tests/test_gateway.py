"""The gateway on uvicorn between real clients (openai, httpx) and a fake upstream and policy on uvicorn."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from online_testlib import (
    ADMIN_KEY,
    HTTP,
    MODELS_BODY,
    POLICY_LOGPROBS,
    POLICY_PROMPT_IDS,
    POLICY_TOKENS,
    POLICY_VERSION,
    TRAFFIC_KEY,
    UPSTREAM_BODY,
    UPSTREAM_CHUNKS,
    UPSTREAM_KEY,
    free_port,
)

MESSAGES = [{"role": "user", "content": "hi"}]
BODY = {"model": "gpt-up", "messages": MESSAGES}


def gw(server: Any) -> Any:
    return server.server.config.app.state.gateway


def wait_recorded(server: Any, n: int) -> None:
    """Wait for the store to acknowledge ``n`` calls (writes are queued, then group-committed)."""
    store = gw(server).store
    done = store.submit(lambda db: None)  # queued after every earlier write: resolves once they committed
    done.result(10)
    assert store.count("calls") == n


def post(server: Any, body: Any, key: str | None = TRAFFIC_KEY, **kw: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    headers.update(kw.pop("headers", {}))
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return HTTP.post(f"{server.v1}/chat/completions", content=content, headers=headers, timeout=10, **kw)


def client(server: Any, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server.v1, api_key=TRAFFIC_KEY, default_headers=headers or None, max_retries=0, http_client=HTTP
    )


# -- unsampled: byte-identical pass-through ------------------------------------------------------------------------


def test_unsampled_non_stream_is_byte_identical(gateway, upstream, fakes):
    up, _ = fakes
    server = gateway()
    direct = HTTP.post(f"{upstream[1].v1}/chat/completions", json=BODY)
    via = post(server, BODY, headers={"x-session-id": "s1", "cookie": "c=1"})
    assert via.status_code == direct.status_code == 200
    assert via.content == direct.content == UPSTREAM_BODY
    assert via.headers["content-type"] == direct.headers["content-type"]
    assert via.headers["x-upstream"] == "yes"
    assert "x-reinforge-trace-id" not in via.headers
    headers, raw = up.requests[-1]
    assert raw == json.dumps(BODY).encode()  # the body bytes unchanged
    assert headers["authorization"] == f"Bearer {UPSTREAM_KEY}"  # the gateway's key, not the client's
    assert "cookie" not in headers
    assert gw(server).store.count("calls") == 0


def test_unsampled_stream_is_byte_identical_and_openai_reads_it(gateway, upstream, fakes):
    server = gateway()
    with HTTP.stream("POST", f"{upstream[1].v1}/chat/completions", json={**BODY, "stream": True}) as r:
        direct = b"".join(r.iter_raw())
    with HTTP.stream(
        "POST",
        f"{server.v1}/chat/completions",
        json={**BODY, "stream": True},
        headers={"authorization": f"Bearer {TRAFFIC_KEY}"},
    ) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        via = b"".join(r.iter_raw())
    assert via == direct == b"".join(UPSTREAM_CHUNKS)
    text = "".join(
        c.choices[0].delta.content or ""
        for c in client(server).chat.completions.create(model="gpt-up", messages=MESSAGES, stream=True)
    )
    assert text == "up stream"
    plain = client(server).chat.completions.create(model="gpt-up", messages=MESSAGES)
    assert plain.choices[0].message.content == "from the upstream \u00e9"


def test_models_pass_through(gateway):
    server = gateway()
    r = HTTP.get(f"{server.v1}/models", headers={"authorization": f"Bearer {TRAFFIC_KEY}"})
    assert r.status_code == 200 and r.content == MODELS_BODY
    assert [m.id for m in client(server).models.list()] == ["gpt-up"]


# -- sampled: the policy answers, the call is recorded --------------------------------------------------------------


def test_sampled_non_stream_recorded_with_token_ids(gateway, fakes):
    _, pol = fakes
    server = gateway(selection={"sampling_rate": 1.0})
    raw = client(server).chat.completions.with_raw_response.create(model="gpt-up", messages=MESSAGES)
    reply = raw.parse()
    assert reply.choices[0].message.content == "policy"
    assert reply.model == "gpt-up"  # the client's model name back, not the policy's
    data = json.loads(raw.http_response.content)
    assert "prompt_token_ids" not in data and "token_ids" not in data["choices"][0]
    assert data["choices"][0]["logprobs"] is None
    trace_id = raw.headers["x-reinforge-trace-id"]
    assert raw.headers["x-reinforge-feedback-token"]
    sent = pol.bodies()[-1]
    assert sent["return_token_ids"] is True and sent["logprobs"] is True and sent["model"] == "pol"
    wait_recorded(server, 1)
    trace = gw(server).store.trace(trace_id)
    (call,) = trace["calls"]
    assert call["prompt_token_ids"] == POLICY_PROMPT_IDS
    assert call["token_ids"] == POLICY_TOKENS
    assert call["logprobs"] == POLICY_LOGPROBS
    assert call["policy_version"] == POLICY_VERSION
    assert call["request"]["messages"] == MESSAGES
    assert call["response"]["choices"][0]["message"]["content"] == "policy"
    assert call["timing"]["upstream_s"] >= 0


def test_sampled_keeps_fields_the_client_asked_for(gateway):
    server = gateway(selection={"sampling_rate": 1.0})
    data = post(server, {**BODY, "logprobs": True, "return_token_ids": True}).json()
    assert data["prompt_token_ids"] == POLICY_PROMPT_IDS
    assert data["choices"][0]["token_ids"] == POLICY_TOKENS
    assert [e["logprob"] for e in data["choices"][0]["logprobs"]["content"]] == POLICY_LOGPROBS


def test_sampled_stream_recorded_and_stripped(gateway):
    server = gateway(selection={"sampling_rate": 1.0})
    with client(server).chat.completions.with_streaming_response.create(
        model="gpt-up", messages=MESSAGES, stream=True
    ) as resp:
        trace_id = resp.headers["x-reinforge-trace-id"]
        chunks = list(resp.parse())
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "policy"
    for c in chunks:
        dumped = c.model_dump()
        assert "prompt_token_ids" not in (c.model_extra or {})
        assert all(ch.get("logprobs") is None and "token_ids" not in ch for ch in dumped["choices"])
        assert c.model == "gpt-up"
    wait_recorded(server, 1)
    (call,) = gw(server).store.trace(trace_id)["calls"]
    assert call["token_ids"] == POLICY_TOKENS and call["prompt_token_ids"] == POLICY_PROMPT_IDS
    assert call["logprobs"] == POLICY_LOGPROBS
    assert call["response"]["choices"][0]["message"]["content"] == "policy"
    assert call["response"]["choices"][0]["finish_reason"] == "stop"


def test_record_mode_records_what_the_upstream_returns(gateway, policy, fakes):
    _, pol = fakes
    # record: the upstream is the policy itself
    server = gateway(upstream_url=policy[1].v1, mode="record", selection={"sampling_rate": 1.0})
    r = post(server, BODY)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "policy"
    assert pol.bodies()[-1]["return_token_ids"] is True
    assert pol.requests[-1][0]["authorization"] == f"Bearer {UPSTREAM_KEY}"
    wait_recorded(server, 1)
    (call,) = gw(server).store.trace(r.headers["x-reinforge-trace-id"])["calls"]
    assert call["token_ids"] == POLICY_TOKENS


# -- faults ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_policy_down_falls_back_to_the_upstream(gateway, stream):
    server = gateway(policy_url=f"http://127.0.0.1:{free_port()}/v1", selection={"sampling_rate": 1.0})
    r = post(server, {**BODY, "stream": stream})
    assert r.status_code == 200
    assert r.content == (b"".join(UPSTREAM_CHUNKS) if stream else UPSTREAM_BODY)
    assert "x-reinforge-trace-id" not in r.headers
    assert gw(server).metrics.fallbacks.labels("unreachable")._value.get() == 1
    wait_recorded(server, 0)  # a stream's first row, queued before the policy was asked, is taken back
    assert gw(server).store.trace_ids() == []


def test_policy_5xx_falls_back(gateway, fakes):
    fakes[1].fail = True
    server = gateway(selection={"sampling_rate": 1.0})
    r = post(server, BODY)
    assert r.status_code == 200 and r.content == UPSTREAM_BODY
    assert gw(server).metrics.fallbacks.labels("server_error")._value.get() == 1


@pytest.mark.parametrize("rate", [0.0, 1.0])
def test_upstream_down_is_a_502_and_nothing_is_recorded(gateway, rate):
    dead = f"http://127.0.0.1:{free_port()}/v1"
    server = gateway(upstream_url=dead, policy_url=dead, selection={"sampling_rate": rate})
    r = post(server, BODY)
    assert r.status_code == 502
    assert r.json()["error"]["code"] == "upstream_unreachable"
    with pytest.raises(openai.InternalServerError):
        client(server).chat.completions.create(model="gpt-up", messages=MESSAGES)
    wait_recorded(server, 0)


def test_wrong_or_missing_key_is_401(gateway, fakes):
    server = gateway()
    assert post(server, BODY, key=None).status_code == 401
    assert post(server, BODY, key="nope").json()["error"]["code"] == "invalid_api_key"
    assert post(server, BODY, key=ADMIN_KEY).status_code == 401  # the admin key is not a traffic key
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.v1, api_key="wrong", max_retries=0, http_client=HTTP).chat.completions.create(
            model="gpt-up", messages=MESSAGES
        )
    assert HTTP.get(f"{server.v1}/models").status_code == 401
    assert HTTP.get(f"{server.base}/metrics", headers={"authorization": f"Bearer {TRAFFIC_KEY}"}).status_code == 401
    assert fakes[0].requests == []


def test_oversized_and_malformed_bodies(gateway, fakes):
    server = gateway(limits={"max_body_bytes": 1000})
    big = {**BODY, "messages": [{"role": "user", "content": "x" * 2000}]}
    r = post(server, big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    r = post(server, b'{"model": "gpt-up", "messages": [')
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    assert post(server, b"[1, 2]").status_code == 400
    assert fakes[0].requests == []
    assert post(server, BODY).status_code == 200  # and it goes on


def test_healthz_and_metrics(gateway):
    server = gateway(selection={"sampling_rate": 1.0})
    post(server, BODY)
    assert HTTP.get(f"{server.base}/healthz").json() == {"status": "ok", "store": "ok", "sampling": True}
    text = HTTP.get(f"{server.base}/metrics", headers={"authorization": f"Bearer {ADMIN_KEY}"}).text
    assert 'reinforge_online_requests_total{path="policy",route="/v1/chat/completions",status="200"} 1.0' in text
    assert "reinforge_online_sampled_total 1.0" in text
    assert "reinforge_online_added_latency_seconds_bucket" in text


def test_chat_errors_are_json_counted_and_the_gateway_goes_on(gateway, fakes, monkeypatch):
    server = gateway()
    g = gw(server)
    assert post(server, BODY, key="nope").status_code == 401

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a selection strategy's bug")

    with monkeypatch.context() as m:
        m.setattr(g.pipeline, "select", broken)
        r = post(server, BODY)
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    assert "selection strategy" not in r.text  # the cause is logged, not told to the caller
    assert post(server, BODY).content == UPSTREAM_BODY
    assert HTTP.get(f"{server.v1}/chat/completions").status_code == 405  # only POST is the chat route
    text = HTTP.get(f"{server.base}/metrics", headers={"authorization": f"Bearer {ADMIN_KEY}"}).text
    for path, status in (("gateway", "401"), ("gateway", "500"), ("upstream", "200")):
        assert (
            f'reinforge_online_requests_total{{path="{path}",route="/v1/chat/completions",status="{status}"}} 1.0'
            in text
        )


def test_sampling_pauses_while_the_store_is_unhealthy(gateway, fakes):
    import sqlite3

    server = gateway(selection={"sampling_rate": 1.0})
    store = gw(server).store
    blocker = sqlite3.connect(store.path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")  # the database is locked for everyone else
    try:
        r = post(server, BODY)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "policy"  # still served
        assert store.wait_healthy(False, timeout=10)
        r = post(server, BODY)  # sampling paused: the upstream answers
        assert r.content == UPSTREAM_BODY
        m = gw(server).metrics
        assert m.paused.labels("store")._value.get() == 1
        assert m.store_errors.labels("write_failed")._value.get() == 1
        assert HTTP.get(f"{server.base}/healthz").json()["store"] == "unhealthy"
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert store.wait_healthy(True, timeout=10)  # a probe write succeeded
    assert post(server, BODY).json()["choices"][0]["message"]["content"] == "policy"
    wait_recorded(server, 1)


def test_the_upstream_sees_the_clients_headers_not_httpx_defaults(gateway, fakes):
    import http.client

    server = gateway()
    raw = json.dumps(BODY).encode()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.putrequest("POST", "/v1/chat/completions", skip_accept_encoding=True)
    for name, value in {
        "authorization": f"Bearer {TRAFFIC_KEY}",
        "content-type": "application/json",
        "content-length": str(len(raw)),
        "x-reinforge-sample": "1",
        "connection": "keep-alive, x-hop",
        "x-hop": "secret",
        "openai-organization": "org-1",
    }.items():
        conn.putheader(name, value)
    conn.endheaders(raw)
    resp = conn.getresponse()
    assert resp.status == 200 and resp.read() == UPSTREAM_BODY
    conn.close()
    headers, body = fakes[0].requests[-1]
    assert body == raw
    assert "accept-encoding" not in headers and "user-agent" not in headers and "accept" not in headers
    assert "x-reinforge-sample" not in headers and "x-hop" not in headers
    assert headers["openai-organization"] == "org-1"
    via = post(server, BODY, headers={"accept-encoding": "identity", "user-agent": "agent/1"})
    assert via.status_code == 200
    assert fakes[0].requests[-1][0]["accept-encoding"] == "identity"
    assert fakes[0].requests[-1][0]["user-agent"] == "agent/1"


def test_a_policy_answer_that_is_not_a_completion_falls_back(gateway, fakes):
    fakes[1].behaviour = "garbage"
    server = gateway(selection={"sampling_rate": 1.0})
    r = post(server, BODY)
    assert r.status_code == 200 and r.content == UPSTREAM_BODY
    assert gw(server).metrics.fallbacks.labels("bad_response")._value.get() == 1


def test_a_policy_stream_that_fails_midway_is_relayed_and_stored_as_failed(gateway, fakes):
    fakes[1].behaviour = "error_event"
    server = gateway(selection={"sampling_rate": 1.0})
    r = post(server, {**BODY, "stream": True})
    assert r.status_code == 200
    assert b'"error"' in r.content and r.content.endswith(b"data: [DONE]\n\n")
    wait_recorded(server, 1)
    (call,) = gw(server).store.trace(r.headers["x-reinforge-trace-id"])["calls"]
    assert call["state"] == "failed"  # never half-stored as complete
    assert gw(server).metrics.streams.labels("failed")._value.get() == 1


def test_sampling_pauses_after_policy_failures_and_resumes(gateway, fakes):
    fakes[1].fail = True
    server = gateway(selection={"sampling_rate": 1.0}, policy={"failures_before_pause": 2, "pause_s": 3600})
    m = gw(server).metrics
    with httpx.Client(headers={"authorization": f"Bearer {TRAFFIC_KEY}"}, verify=False) as c:
        for _ in range(4):
            assert c.post(f"{server.v1}/chat/completions", json=BODY).content == UPSTREAM_BODY
    assert m.fallbacks.labels("server_error")._value.get() == 2  # then the breaker opened
    assert m.paused.labels("policy")._value.get() == 2 and m.policy_healthy._value.get() == 0
    assert len(fakes[1].requests) == 2
    fakes[1].fail = False
    gw(server).pipeline._policy_paused_until = 1.0  # the pause is over (a monotonic time long past)
    r = post(server, BODY)
    assert r.json()["choices"][0]["message"]["content"] == "policy" and m.policy_healthy._value.get() == 1


def test_the_upstreams_own_errors_pass_through_unchanged(gateway, upstream, fakes):
    fakes[0].fail = True
    server = gateway()
    direct = HTTP.post(f"{upstream[1].v1}/chat/completions", json=BODY)
    via = post(server, BODY)
    assert via.status_code == direct.status_code == 500
    assert via.content == direct.content and via.json()["error"]["message"] == "upstream broke"


def test_an_episode_of_several_calls_continues_one_trace(gateway, fakes):
    server = gateway(selection={"sampling_rate": 0.0})  # continuing a trace does not depend on selection
    # the first call is marked for sampling by a gateway with sampling on; here, start it by hand
    store = gw(server).store
    from online_testlib import SECRET

    from reinforge_online import CallRecord, feedback_token

    store.record(CallRecord("ep1", "c0", "/v1/chat/completions", "route", {"messages": []}, {})).result(10)
    token = feedback_token(SECRET, "ep1")
    headers = {"x-reinforge-trace-id": "ep1", "x-reinforge-feedback-token": token}
    for turn in range(2):
        r = post(server, {**BODY, "messages": [*MESSAGES, {"role": "user", "content": str(turn)}]}, headers=headers)
        assert r.status_code == 200 and r.headers["x-reinforge-trace-id"] == "ep1"
        assert r.json()["choices"][0]["message"]["content"] == "policy"
    wait_recorded(server, 3)
    calls = store.trace("ep1")["calls"]
    assert [c["call_id"] for c in calls][0] == "c0" and len(calls) == 3
    assert calls[2]["request"]["messages"][-1]["content"] == "1"
    assert all("x-reinforge-trace-id" not in h for h, _ in fakes[1].requests)
    bad = post(server, BODY, headers={**headers, "x-reinforge-feedback-token": "0" * 64})
    assert bad.status_code == 401 and bad.json()["error"]["code"] == "invalid_feedback_token"
    fb = HTTP.post(
        f"{server.base}/online/v1/feedback",
        json={"trace_id": "ep1", "reward": 1.0},
        headers={"x-reinforge-feedback-token": token},
    )
    assert fb.status_code == 200
    assert post(server, BODY, headers=headers).status_code == 200  # served, but the trace is closed
    wait_recorded(server, 3)
    assert gw(server).metrics.closed_trace_calls._value.get() == 1


@pytest.mark.parametrize(
    ("ref", "stored", "drops"),
    [
        ("online_testlib:redact_contents", 1, None),
        ("online_testlib:redact_everything", 0, "dropped"),
        ("online_testlib:redact_raises", 0, "error"),
    ],
)
def test_the_redactor_sees_every_call_before_it_is_stored(gateway, ref, stored, drops):
    server = gateway(selection={"sampling_rate": 1.0}, redact=ref)
    r = post(server, BODY)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "policy"  # the client's is intact
    wait_recorded(server, stored)
    if stored:
        (call,) = gw(server).store.trace(r.headers["x-reinforge-trace-id"])["calls"]
        assert call["request"]["messages"][0]["content"] == "[redacted]"
        assert call["response"]["choices"][0]["message"]["content"] == "[redacted]"
        assert call["token_ids"] == POLICY_TOKENS
    else:
        assert "x-reinforge-trace-id" not in r.headers
        assert gw(server).metrics.redacted.labels(drops)._value.get() == 1


def test_a_redactor_that_does_not_resolve_is_a_config_error(tmp_path):
    from online_testlib import SECRETS, settings

    from reinforge.plugin import ConfigError
    from reinforge_online.app import build_app

    s = settings("http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1", tmp_path / "t.sqlite", redact="no_such_mod:f")
    with pytest.raises(ConfigError, match="redact"):
        build_app(s, SECRETS)


def test_an_upstream_that_does_not_answer_in_time_is_a_504(gateway, fakes):
    fakes[0].behaviour = "hang"
    server = gateway(upstream={"timeout_s": 0.2})
    r = post(server, BODY)
    assert r.status_code == 504 and r.json()["error"]["code"] == "upstream_timeout"
    fakes[0].hold.set()

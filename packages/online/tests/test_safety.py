"""What an operator or an attacker found wrong with 0.1, each a test (issue 30's findings 1-5 and 7).

Real parts: the gateway on uvicorn in front of the fake upstream and policy, httpx and curl as clients.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
from typing import Any

import httpx
import pytest
from online_testlib import HTTP, TRAFFIC_KEY, UPSTREAM_BODY, UPSTREAM_CHUNKS

MESSAGES = [{"role": "user", "content": "hi"}]
AUTH = {"authorization": f"Bearer {TRAFFIC_KEY}"}


def gw(server: Any) -> Any:
    return server.server.config.app.state.gateway


def post(server: Any, body: Any, **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return HTTP.post(f"{server.v1}/chat/completions", content=content, headers={**AUTH, **headers})


def value(metric: Any) -> float:
    return float(metric._value.get())


# -- 1. acknowledged means durable ------------------------------------------------------------------------------


def test_a_sampled_call_the_store_cannot_commit_gets_no_trace_headers_and_is_counted(gateway, tmp_path, caplog):
    server = gateway(selection={"sampling_rate": 1.0}, store={"busy_timeout_ms": 50, "ack_timeout_ms": 2000})
    store_file = gw(server).store.path
    locker = sqlite3.connect(store_file, timeout=5, isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")  # another connection holds the write lock past busy_timeout_ms
    try:
        r = post(server, {"model": "m", "messages": MESSAGES, "user": "u1"})
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "policy"  # still answered
    assert "x-reinforge-trace-id" not in r.headers and "x-reinforge-feedback-token" not in r.headers
    m = gw(server).metrics
    assert value(m.traces_dropped.labels("write_failed")) == 1
    assert "not acknowledged (write_failed" in caplog.text
    gw(server).store.wait_healthy(True, 10)
    assert gw(server).store.trace_ids() == []  # nothing half-kept: the client was told nothing, nothing is there


def test_a_stream_is_acknowledged_only_after_its_row_committed(gateway):
    server = gateway(selection={"sampling_rate": 1.0})
    store = gw(server).store
    with HTTP.stream(
        "POST", f"{server.v1}/chat/completions", json={"model": "m", "messages": MESSAGES, "stream": True}, headers=AUTH
    ) as r:
        trace_id = r.headers["x-reinforge-trace-id"]
        # the headers are here; the row must already be readable by another connection, before any byte of the body
        reader = sqlite3.connect(store.path)
        row = reader.execute("SELECT c.state FROM calls c WHERE c.trace_id = ?", (trace_id,)).fetchone()
        reader.close()
        assert row is not None
        r.read()
    store.submit(lambda db: None).result(10)
    assert store.trace(trace_id)["calls"][0]["state"] == "complete"


# -- 2. client errors are not policy failures -------------------------------------------------------------------


def test_bad_sampling_fields_are_400_before_routing_and_leave_sampling_on(gateway, fakes):
    server = gateway(selection={"sampling_rate": 1.0}, policy={"failures_before_pause": 3, "pause_s": 3600})
    for i in range(3):
        r = post(server, {"model": "m", "messages": MESSAGES, "temperature": "hot", "user": f"attacker-{i}"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "temperature", r.text
    assert fakes[1].requests == [] and fakes[0].requests == []  # neither the policy nor the upstream was asked
    good = post(server, {"model": "m", "messages": MESSAGES, "user": "someone-else"})
    assert good.json()["choices"][0]["message"]["content"] == "policy" and "x-reinforge-trace-id" in good.headers
    assert value(gw(server).metrics.policy_healthy) == 1


@pytest.mark.parametrize(
    ("upstream_behaviour", "breaker_opens"),
    [("reject", False), ("ok", True)],
    ids=["both-refuse-client-error", "only-the-policy-refuses"],
)
def test_a_policy_4xx_trips_the_breaker_only_when_the_upstream_answers(
    gateway, fakes, upstream_behaviour, breaker_opens
):
    fakes[1].behaviour, fakes[0].behaviour = "reject", upstream_behaviour
    server = gateway(selection={"sampling_rate": 1.0}, policy={"failures_before_pause": 3, "pause_s": 3600})
    for i in range(3):
        r = post(server, {"model": "m", "messages": MESSAGES, "user": f"u{i}"})
        assert r.status_code == (400 if upstream_behaviour == "reject" else 200)  # the upstream's answer
    m = gw(server).metrics
    assert value(m.fallbacks.labels("rejected")) == 3
    assert value(m.policy_healthy) == (0 if breaker_opens else 1)


# -- 3. honest streams: a policy stream that is not one falls back -----------------------------------------------


@pytest.mark.parametrize(("behaviour", "reason"), [("json_stream", "bad_response"), ("empty_stream", "empty_stream")])
def test_a_policy_stream_that_is_not_sse_or_is_empty_falls_back_to_the_upstream(gateway, fakes, behaviour, reason):
    fakes[1].behaviour = behaviour
    server = gateway(selection={"sampling_rate": 1.0})
    r = post(server, {"model": "m", "messages": MESSAGES, "stream": True})
    assert r.status_code == 200 and r.content == b"".join(UPSTREAM_CHUNKS)  # the upstream's stream, whole
    assert "x-reinforge-trace-id" not in r.headers
    assert value(gw(server).metrics.fallbacks.labels(reason)) == 1
    gw(server).store.submit(lambda db: None).result(10)  # the stream's first row, taken back
    assert gw(server).store.trace_ids() == [] and gw(server).store.count("calls") == 0


# -- 4. NaN and Infinity ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b'{"model": "m", "messages": [], "temperature": NaN}', "temperature"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x", "w": Infinity}]}', "messages[0].w"),
        (b'{"model": "m", "messages": [], "top_p": 1e999}', "top_p"),
    ],
)
def test_non_finite_numbers_are_400_naming_the_field_on_every_route(gateway, fakes, raw, param):
    for rate in (1.0, 0.0):  # sampled or not: never forwarded, never stored
        server = gateway(selection={"sampling_rate": rate})
        r = post(server, raw)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        assert r.json()["error"]["code"] == "invalid_number"
    assert fakes[0].requests == [] and fakes[1].requests == []


# -- 5. a stream that breaks off is not turned into a clean ending ----------------------------------------------


@pytest.mark.parametrize("rate", [0.0, 1.0], ids=["unsampled", "sampled"])
def test_a_stream_that_breaks_off_cuts_the_clients_response(gateway, fakes, rate):
    fakes[0].behaviour = fakes[1].behaviour = "break"
    server = gateway(selection={"sampling_rate": rate})
    with (
        pytest.raises(httpx.RemoteProtocolError),
        HTTP.stream(
            "POST",
            f"{server.v1}/chat/completions",
            json={"model": "m", "messages": MESSAGES, "stream": True},
            headers=AUTH,
        ) as r,
    ):
        assert r.status_code == 200
        r.read()
    path = "policy" if rate else "upstream"
    m = gw(server).metrics
    assert value(m.broken_streams.labels(path)) == 1
    if rate:
        store = gw(server).store
        store.submit(lambda db: None).result(10)
        (trace_id,) = store.trace_ids()
        assert store.trace(trace_id)["calls"][0]["state"] == "aborted"  # never half-stored as complete


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
@pytest.mark.parametrize("rate", [0.0, 1.0], ids=["unsampled", "sampled"])
def test_curl_sees_the_cut_as_the_upstreams_own(gateway, upstream, fakes, rate):
    """The finding as it was made: straight to the upstream curl exits 18; through the gateway too."""
    fakes[0].behaviour = fakes[1].behaviour = "break"
    server = gateway(selection={"sampling_rate": rate})
    body = json.dumps({"model": "m", "messages": MESSAGES, "stream": True})

    def curl(url: str, *headers: str) -> int:
        args = ["curl", "-sN", "-o", "/dev/null", "-X", "POST", url, "-H", "content-type: application/json", "-d", body]
        for h in headers:
            args += ["-H", h]
        return subprocess.run(args, timeout=30).returncode

    assert curl(f"{upstream[1].v1}/chat/completions") == 18
    assert curl(f"{server.v1}/chat/completions", f"authorization: Bearer {TRAFFIC_KEY}") == 18


def test_an_unbroken_stream_still_ends_cleanly(gateway, fakes):
    server = gateway(selection={"sampling_rate": 0.0})
    r = post(server, {"model": "m", "messages": MESSAGES, "stream": True})
    assert r.status_code == 200 and r.content == b"".join(UPSTREAM_CHUNKS)
    assert post(server, {"model": "m", "messages": MESSAGES}).content == UPSTREAM_BODY


# -- 7. safe defaults -------------------------------------------------------------------------------------------


def test_rate_limits_are_on_by_default(gateway):
    from reinforge_online.config import LimitSettings

    limits = LimitSettings()
    assert (limits.requests_per_s, limits.burst) == (100.0, 200)
    server = gateway(limits={"burst": 3, "requests_per_s": 0.01})  # the default limiter, small enough to reach
    codes = [post(server, {"model": "m", "messages": MESSAGES}).status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]


def test_sampling_is_keyed_by_the_servers_secret_not_the_files_salt(tmp_path, upstream, policy, fakes):
    """Two gateways with the same online.yaml and different secrets sample different sessions: a client that
    reads the file (salt included) still cannot tell which of its sessions are sampled."""
    from online_testlib import SECRETS, settings

    from reinforge.testing import BackgroundServer
    from reinforge_online.app import build_app

    decisions = []
    for i, secret in enumerate((b"secret-one", b"secret-two")):
        s = settings(upstream[1].v1, policy[1].v1, tmp_path / f"s{i}.sqlite", selection={"sampling_rate": 0.5})
        with BackgroundServer(build_app(s, SECRETS.__class__(**{**SECRETS.__dict__, "feedback_secret": secret}))) as g:
            decisions.append(
                [
                    "x-reinforge-trace-id" in post(g, {"model": "m", "messages": MESSAGES, "user": f"s{k}"}).headers
                    for k in range(24)
                ]
            )
    assert decisions[0] != decisions[1]
    assert 0 < sum(decisions[0]) < 24 and 0 < sum(decisions[1]) < 24


def test_a_stream_that_broke_off_is_not_judged_as_a_whole_answer(gateway, fakes):
    fakes[1].behaviour = "break"
    server = gateway(selection={"sampling_rate": 1.0}, reward={"judges": ["online_testlib:const_judge"]})
    with (
        pytest.raises(httpx.RemoteProtocolError),
        HTTP.stream(
            "POST",
            f"{server.v1}/chat/completions",
            json={"model": "m", "messages": MESSAGES, "stream": True},
            headers=AUTH,
        ) as r,
    ):
        trace_id = r.headers["x-reinforge-trace-id"]
        r.read()
    rewards = gw(server).pipeline.rewards
    assert rewards.wait_results(1, timeout=10), rewards.results
    assert rewards.results == {"unrewarded/incomplete": 1}
    gw(server).store.submit(lambda db: None).result(10)  # the mark is written
    trace = gw(server).store.trace(trace_id)
    assert trace["status"] == "unrewarded" and trace["reward"] is None  # never a reward for half an answer

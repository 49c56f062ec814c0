"""POST /online/v1/feedback on the real gateway: tokens, 401/404/400/409, idempotency, nothing written on errors."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from online_testlib import HTTP, SECRET, TRAFFIC_KEY

from reinforge_online import feedback_token

BODY = {"model": "gpt-up", "messages": [{"role": "user", "content": "hi"}]}


def gw(server: Any) -> Any:
    return server.server.config.app.state.gateway


def sampled(server: Any) -> tuple[str, str]:
    r = HTTP.post(f"{server.v1}/chat/completions", json=BODY, headers={"authorization": f"Bearer {TRAFFIC_KEY}"})
    assert r.status_code == 200
    return r.headers["x-reinforge-trace-id"], r.headers["x-reinforge-feedback-token"]


def send(server: Any, body: Any, token: str | None) -> httpx.Response:
    headers = {"x-reinforge-feedback-token": token} if token else {}
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return HTTP.post(f"{server.base}/online/v1/feedback", content=content, headers=headers)


@pytest.fixture
def server(gateway: Any) -> Any:
    return gateway(selection={"sampling_rate": 1.0})


def test_feedback_right_after_the_response_is_recorded(server):
    trace_id, token = sampled(server)
    assert token == feedback_token(SECRET, trace_id)
    r = send(server, {"trace_id": trace_id, "reward": 0.75, "idempotency_key": "k1"}, token)
    assert r.status_code == 200, r.text
    assert r.json() == {"trace_id": trace_id, "reward": 0.75, "status": "recorded"}
    trace = gw(server).store.trace(trace_id)
    assert trace["reward"] == 0.75 and trace["status"] == "rewarded"


def test_token_in_the_body_works_too(server):
    trace_id, token = sampled(server)
    assert send(server, {"trace_id": trace_id, "reward": 1, "feedback_token": token}, None).status_code == 200


def test_forged_missing_or_other_traces_token_is_401_and_writes_nothing(server):
    trace_id, token = sampled(server)
    other_id, other_token = sampled(server)
    for bad in (None, "0" * 64, other_token, feedback_token(b"another secret", trace_id)):
        r = send(server, {"trace_id": trace_id, "reward": 1.0, "idempotency_key": "k"}, bad)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_feedback_token"
    r = send(server, {"trace_id": "no-such-trace", "reward": 1.0}, token)
    assert r.status_code == 401  # a token for another trace: 401 before the store is asked
    store = gw(server).store
    assert store.count("rewards") == 0 and store.count("feedback") == 0


def test_unknown_trace_with_its_valid_token_is_404(server):
    sampled(server)
    r = send(server, {"trace_id": "deadbeef", "reward": 1.0}, feedback_token(SECRET, "deadbeef"))
    assert r.status_code == 404 and r.json()["error"]["code"] == "trace_not_found"


@pytest.mark.parametrize(
    "raw",
    [
        b'{"trace_id": "%s", "reward": NaN}',
        b'{"trace_id": "%s", "reward": Infinity}',
        b'{"trace_id": "%s", "reward": -Infinity}',
        b'{"trace_id": "%s", "reward": "1.0"}',
        b'{"trace_id": "%s", "reward": true}',
        b'{"trace_id": "%s"}',
        b'{"trace_id": "%s", "reward": 1, "extra": 2}',
        b'{"trace_id": "%s", "reward": 1, "idempotency_key": 5}',
        b'{"trace_id": "%s", "reward": ',
    ],
)
def test_bad_rewards_are_400_and_write_nothing(server, raw):
    trace_id, token = sampled(server)
    r = send(server, raw.replace(b"%s", trace_id.encode()), token)
    assert r.status_code == 400, r.text
    assert gw(server).store.count("rewards") == 0


def test_duplicate_key_returns_the_first_answer_and_conflicts_are_409(server):
    trace_id, token = sampled(server)
    first = send(server, {"trace_id": trace_id, "reward": 1.0, "idempotency_key": "a"}, token)
    again = send(server, {"trace_id": trace_id, "reward": 1.0, "idempotency_key": "a"}, token)
    assert first.status_code == again.status_code == 200 and first.json() == again.json()
    # the same key with another reward is refused, naming the reward it stored: the client learns it was not taken
    reused = send(server, {"trace_id": trace_id, "reward": 0.0, "idempotency_key": "a"}, token)
    assert reused.status_code == 409 and reused.json()["error"]["code"] == "idempotency_key_reused"
    assert reused.json()["stored"] == first.json() and reused.json()["error"]["param"] == "idempotency_key"
    conflict = send(server, {"trace_id": trace_id, "reward": 0.0, "idempotency_key": "b"}, token)
    assert conflict.status_code == 409 and conflict.json()["error"]["code"] == "reward_conflict"
    assert send(server, {"trace_id": trace_id, "reward": 0.0, "idempotency_key": "b"}, token).status_code == 409
    same = send(server, {"trace_id": trace_id, "reward": 1.0, "idempotency_key": "c"}, token)
    assert same.status_code == 200 and same.json()["status"] == "unchanged"
    assert gw(server).store.trace(trace_id)["reward"] == 1.0
    m = gw(server).metrics.feedback
    assert m.labels("200")._value.get() == 3 and m.labels("409")._value.get() == 3


def test_rejected_and_unchanged_feedback_leaves_no_rows(server):
    """Only answers that changed the reward are kept under their key: new keys cannot grow the table."""
    trace_id, token = sampled(server)
    assert send(server, {"trace_id": trace_id, "reward": 1.0, "idempotency_key": "k0"}, token).status_code == 200
    for i in range(1, 30):
        reward = 0.0 if i % 2 else 1.0  # conflicts (409) and repeats (unchanged), each with a fresh key
        assert send(
            server, {"trace_id": trace_id, "reward": reward, "idempotency_key": f"k{i}"}, token
        ).status_code in (
            200,
            409,
        )
    assert gw(server).store.count("feedback") == 1


def test_out_of_range_rewards_are_400_naming_the_range_and_nothing_is_stored(server):
    trace_id, token = sampled(server)
    for reward in (1e300, -2.0, 1.5):
        r = send(server, {"trace_id": trace_id, "reward": reward}, token)
        assert r.status_code == 400 and r.json()["error"]["code"] == "reward_out_of_range"
        assert "[-1, 1]" in r.json()["error"]["message"] and r.json()["error"]["param"] == "reward"
    assert gw(server).store.trace(trace_id)["reward"] is None and gw(server).store.count("feedback") == 0


def test_last_before_commit_replaces_within_the_declared_range(gateway):
    server = gateway(selection={"sampling_rate": 1.0}, feedback={"conflict": "last-before-commit", "reward_max": 5.0})
    trace_id, token = sampled(server)
    assert send(server, {"trace_id": trace_id, "reward": 6.0}, token).status_code == 400
    assert send(server, {"trace_id": trace_id, "reward": 5.0}, token).json()["status"] == "recorded"
    r = send(server, {"trace_id": trace_id, "reward": 0.5}, token)
    assert r.status_code == 200 and r.json()["status"] == "replaced"
    assert gw(server).store.trace(trace_id)["reward"] == 0.5

"""POST /online/v1/traces/{trace_id}/close on the real gateway: scoring, tokens, 404/409, idempotency."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from online_testlib import HTTP, SECRET, TRAFFIC_KEY

from reinforge_online import feedback_token
from reinforge_online.app import CLOSE_ROUTE

BODY = {"model": "gpt-up", "messages": [{"role": "user", "content": "say policy"}], "metadata": {"answer": "policy"}}
LATER = 3600  # reward.close_after_s: the trace closes only when the test closes it


def gw(server: Any) -> Any:
    return server.server.config.app.state.gateway


def sampled(server: Any) -> tuple[str, str]:
    r = HTTP.post(f"{server.v1}/chat/completions", json=BODY, headers={"authorization": f"Bearer {TRAFFIC_KEY}"})
    assert r.status_code == 200, r.text
    return r.headers["x-reinforge-trace-id"], r.headers["x-reinforge-feedback-token"]


def close(server: Any, trace_id: str, token: str | None, body: Any = None) -> httpx.Response:
    headers = {"x-reinforge-feedback-token": token} if token else {}
    content = b"" if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    return HTTP.post(f"{server.base}/online/v1/traces/{trace_id}/close", content=content, headers=headers)


def judged(server: Any, n: int) -> dict[str, int]:
    """Wait until the calculator looked at ``n`` traces; what became of them."""
    rewards = gw(server).pipeline.rewards
    assert rewards.wait_results(n, timeout=10), rewards.results
    gw(server).store.submit(lambda db: None).result(10)  # the reward's own write committed
    return dict(rewards.results)


def nothing_scheduled(server: Any) -> bool:
    """Whether no close reached the reward calculator: no trace due before its ``close_after_s``, none scored.

    Checked on the calculator's loop after every write queued so far (a close's store read included) answered.
    """
    rewards = gw(server).pipeline.rewards
    gw(server).store.submit(lambda db: None).result(10)

    async def idle() -> bool:
        soon = rewards._loop.time() + LATER / 2  # a call's own timer is LATER away; a close's is due now
        return all(h.when() > soon for h in rewards._timers.values()) and not rewards._scoring

    return bool(asyncio.run_coroutine_threadsafe(idle(), rewards._loop).result(10)) and rewards.results == {}


def with_reward(gateway: Any, judge: Any = "online_testlib:const_judge", **reward: Any) -> Any:
    return gateway(selection={"sampling_rate": 1.0}, reward={"judges": [judge], "close_after_s": LATER, **reward})


def test_a_closed_trace_is_scored_by_the_configured_reward(gateway):
    server = with_reward(gateway, {"ref": "online_testlib:const_judge", "args": {"value": 0.75}})
    trace_id, token = sampled(server)
    r = close(server, trace_id, token)  # right after the response: the close is ordered after the trace's write
    assert r.status_code == 200, r.text
    assert r.json() == {"trace_id": trace_id, "state": "open", "scoring": True}
    assert judged(server, 1) == {"rewarded": 1}
    trace = gw(server).store.trace(trace_id)
    assert trace["status"] == "rewarded" and trace["reward"] == 0.75 and trace["reward_source"] == "judge"
    assert trace["reward_metrics"]["reward"] == 0.75
    # closed again: the same answer with its new state, nothing scored or written again
    again = close(server, trace_id, token)
    assert again.status_code == 200 and again.json() == {"trace_id": trace_id, "state": "rewarded", "scoring": False}
    assert gw(server).store.trace(trace_id)["reward"] == 0.75
    assert gw(server).metrics.requests.labels(CLOSE_ROUTE, "gateway", "200")._value.get() == 2


def test_the_token_may_come_in_the_body(gateway):
    server = with_reward(gateway)
    trace_id, token = sampled(server)
    r = close(server, trace_id, None, {"feedback_token": token})
    assert r.status_code == 200 and r.json()["scoring"] is True
    assert judged(server, 1) == {"rewarded": 1}


def test_closing_twice_while_the_judges_run_scores_once(gateway):
    server = with_reward(gateway, "online_testlib:Gated")
    (slot,) = gw(server).pipeline.rewards.composer.judges
    judge = slot.fn.func
    trace_id, token = sampled(server)
    assert close(server, trace_id, token).json() == {"trace_id": trace_id, "state": "open", "scoring": True}
    assert judge.started.wait(10), "the judge was never called"
    again = close(server, trace_id, token)  # the judge is still running: its trace is not scored a second time
    assert again.status_code == 200 and again.json() == {"trace_id": trace_id, "state": "open", "scoring": True}
    judge.gate.set()
    assert judged(server, 1) == {"rewarded": 1}
    assert close(server, trace_id, token).json()["state"] == "rewarded"
    assert judge.calls == 1
    assert gw(server).store.trace(trace_id)["reward"] == 0.5


def test_an_unrewarded_trace_stays_unrewarded(gateway):
    judge = {"ref": "online_testlib:FailsFirst", "args": {"failures": 99}}
    server = with_reward(gateway, judge, max_retries=0)
    trace_id, token = sampled(server)
    assert close(server, trace_id, token).status_code == 200
    assert judged(server, 1) == {"unrewarded/failed": 1}
    r = close(server, trace_id, token)
    assert r.status_code == 200 and r.json() == {"trace_id": trace_id, "state": "unrewarded", "scoring": False}
    assert gw(server).pipeline.rewards.composer.judges[0].fn.func.calls == 1


def test_without_a_reward_calculator_the_trace_stays_open_for_feedback(gateway):
    server = gateway(selection={"sampling_rate": 1.0})
    trace_id, token = sampled(server)
    for _ in range(2):
        r = close(server, trace_id, token)
        assert r.status_code == 200 and r.json() == {"trace_id": trace_id, "state": "open", "scoring": False}
    assert gw(server).store.trace(trace_id)["status"] == "open"
    fb = HTTP.post(
        f"{server.base}/online/v1/feedback",
        json={"trace_id": trace_id, "reward": 1.0},
        headers={"x-reinforge-feedback-token": token},
    )
    assert fb.status_code == 200 and fb.json()["status"] == "recorded"


def test_missing_forged_or_other_traces_token_is_401_and_closes_nothing(gateway):
    server = with_reward(gateway)
    trace_id, token = sampled(server)
    _, other_token = sampled(server)
    for bad in (None, "0" * 64, other_token, feedback_token(b"another secret", trace_id)):
        r = close(server, trace_id, bad)
        assert r.status_code == 401, r.text
        assert r.json()["error"]["code"] == "invalid_feedback_token"
    r = close(server, trace_id, None, {"feedback_token": other_token})
    assert r.status_code == 401
    assert nothing_scheduled(server)
    assert gw(server).store.trace(trace_id)["status"] == "open"
    assert gw(server).metrics.requests.labels(CLOSE_ROUTE, "gateway", "401")._value.get() == 5


def test_an_unknown_trace_is_404(gateway):
    server = with_reward(gateway)
    sampled(server)
    r = close(server, "deadbeef", feedback_token(SECRET, "deadbeef"))
    assert r.status_code == 404, r.text
    assert r.json()["error"]["code"] == "trace_not_found" and r.json()["error"]["type"] == "not_found_error"
    assert nothing_scheduled(server)
    assert gw(server).store.trace("deadbeef") is None


def test_a_committed_trace_is_409(gateway, tmp_path: Path):
    server = gateway(
        selection={"sampling_rate": 1.0},
        committer={"kind": "sink", "args": {"path": str(tmp_path / "out")}, "min_traces": 1, "interval_s": 3600},
    )
    trace_id, token = sampled(server)
    fb = HTTP.post(
        f"{server.base}/online/v1/feedback",
        json={"trace_id": trace_id, "reward": 1.0},
        headers={"x-reinforge-feedback-token": token},
    )
    assert fb.status_code == 200
    assert gw(server).pipeline.outbox.wait_committed(1, timeout=10)
    r = close(server, trace_id, token)
    assert r.status_code == 409, r.text
    assert r.json()["error"]["code"] == "trace_committed" and r.json()["error"]["type"] == "conflict_error"
    assert gw(server).store.trace(trace_id)["status"] == "committed"


def test_a_trace_being_committed_is_409(gateway):
    server = with_reward(gateway)
    trace_id, token = sampled(server)
    store = gw(server).store
    store.submit(lambda db: db.execute("UPDATE traces SET status = 'committing' WHERE trace_id = ?", (trace_id,)))
    r = close(server, trace_id, token)
    assert r.status_code == 409 and "committing" in r.json()["error"]["message"]
    assert nothing_scheduled(server)
    assert store.trace(trace_id)["status"] == "committing"


@pytest.mark.parametrize(
    ("raw", "code"),
    [(b"{", "invalid_json"), (b"[1]", "invalid_json"), (b'{"reward": 1}', "unknown_field")],
)
def test_a_bad_body_is_400_and_closes_nothing(gateway, raw, code):
    server = with_reward(gateway)
    trace_id, token = sampled(server)
    r = close(server, trace_id, token, raw)
    assert r.status_code == 400 and r.json()["error"]["code"] == code
    assert nothing_scheduled(server)

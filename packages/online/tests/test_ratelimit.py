"""Per-client token buckets: bursts, refill, 429 with Retry-After, bounded memory; through the gateway."""

from __future__ import annotations

import pytest
from online_testlib import HTTP, TRAFFIC_KEY

from reinforge_online.errors import ApiError
from reinforge_online.ratelimit import RateLimiter


def test_bursts_then_refills_per_client():
    limiter = RateLimiter(2.0, 3)
    for _ in range(3):
        limiter.check("a", now=0.0)
    with pytest.raises(ApiError) as info:
        limiter.check("a", now=0.0)
    assert info.value.status == 429 and info.value.headers == {"retry-after": "1"}
    limiter.check("b", now=0.0)  # another client has its own bucket
    limiter.check("a", now=0.5)  # one token back after half a second at 2/s
    with pytest.raises(ApiError):
        limiter.check("a", now=0.5)


def test_memory_is_bounded():
    limiter = RateLimiter(1.0, 1, max_clients=10)
    for i in range(100):
        limiter.check(f"c{i}", now=0.0)
    assert len(limiter._buckets) == 10


def test_the_gateway_answers_429_past_the_limit(gateway, fakes):
    server = gateway(limits={"requests_per_s": 0.001, "burst": 2})
    headers = {"authorization": f"Bearer {TRAFFIC_KEY}"}
    body = {"model": "m", "messages": []}
    codes = [HTTP.post(f"{server.v1}/chat/completions", json=body, headers=headers).status_code for _ in range(3)]
    assert codes == [200, 200, 429]
    r = HTTP.post(f"{server.v1}/chat/completions", json=body, headers=headers)
    assert r.json()["error"]["code"] == "rate_limit_exceeded" and int(r.headers["retry-after"]) >= 1
    assert len(fakes[0].requests) == 2

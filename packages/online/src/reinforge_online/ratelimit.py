"""Per-client rate limits: a token bucket per client address, answered with 429 and ``Retry-After``.

The traffic key is shared by every caller, so buckets are keyed by the connection's peer
address (behind a proxy that is the proxy: limit there, or per replica). At most
``max_clients`` buckets are kept; the least recently seen go first, so memory stays bounded.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict

from .errors import ApiError

__all__ = ["RateLimiter"]


class RateLimiter:
    """``rate`` requests per second per client, bursts of up to ``burst``."""

    def __init__(self, rate: float, burst: int, *, max_clients: int = 10000) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.max_clients = max_clients
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # client -> (tokens, at)

    def check(self, client: str, now: float | None = None) -> None:
        """Take a token for ``client``, or raise a 429 saying when to retry."""
        now = time.monotonic() if now is None else now
        tokens, at = self._buckets.pop(client, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        if tokens < 1.0:
            self._keep(client, tokens, now)
            wait = math.ceil((1.0 - tokens) / self.rate)
            raise ApiError(
                f"rate limit: at most {self.rate:g} requests per second per client; retry in {wait} s",
                status=429,
                code="rate_limit_exceeded",
                kind="rate_limit_error",
                headers={"retry-after": str(wait)},
            )
        self._keep(client, tokens - 1.0, now)

    def _keep(self, client: str, tokens: float, now: float) -> None:
        self._buckets[client] = (tokens, now)
        while len(self._buckets) > self.max_clients:
            self._buckets.popitem(last=False)
